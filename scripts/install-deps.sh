#!/usr/bin/env bash
# Installs every Debian package the project needs to build, run and test.
# Idempotent: packages already present are skipped, and apt is only asked
# when something is missing. Run as root (or it re-runs itself with sudo).
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config clang libclang-rt-14-dev
  # libraries (see README "Why these libraries")
  libnats-dev libprotobuf-c-dev protobuf-c-compiler libyaml-dev
  libjansson-dev libssl-dev libseccomp-dev libcurl4-openssl-dev libmicrohttpd-dev
  libcjose-dev
  # runtime python-data-analysis-v1 (python3-dill: a session's state); libpython3-dev:
  # ci-zygote embeds it (warm mode)
  python3 python3-numpy python3-pandas python3-matplotlib python3-openpyxl python3-dill
  libpython3-dev
  # broker and test tools
  nats-server nodejs npm procps iproute2 ca-certificates
  # the Helm chart's check (tests/helm/check_chart.py)
  python3-yaml
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # nodejs from another source (e.g. nodesource) provides npm itself
    if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
