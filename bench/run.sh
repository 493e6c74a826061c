#!/usr/bin/env bash
# Runs the benchmark on a Release build:
#   bench/run.sh [--n 30] [--modes cold,warm] [--fanout 1000] [--fanout-cold 100] [--soak 0]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
(cd "$root/tests/integration" && npm ci --no-audit --no-fund --loglevel=error)
export BUILD_DIR=$root/build-release
BUILD_TYPE=Release bash "$root/scripts/build.sh" >/dev/null
export CI_BUILD_DIR=$BUILD_DIR CI_SOURCE_DIR=$root
exec node "$root/bench/bench.mjs" "$@"
