#!/usr/bin/env bash
# Configures and builds into BUILD_DIR (default build/). SANITIZE=1 builds with
# ASan and UBSan, as the test suite does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
args=(-DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo})
if [ "${SANITIZE:-0}" = 1 ]; then args+=(-DCI_SANITIZE=ON); fi
cmake -S "$root" -B "$build" "${args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
