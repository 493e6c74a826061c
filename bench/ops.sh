#!/usr/bin/env bash
# The operations benchmarks on a Release build: bench/ops.sh chaos|soak [options]
#   chaos  2,000 tasks through worker and NATS-leader kills on a 3-node cluster
#   soak   10,000 tasks through one worker: RSS and fds over time
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:?usage: bench/ops.sh chaos|soak [options]}
shift
case "$what" in chaos|soak) ;; *) echo "bench/ops.sh: unknown benchmark '$what'" >&2; exit 2 ;; esac
bash "$root/scripts/install-deps.sh"
(cd "$root/tests/integration" && npm ci --no-audit --no-fund --loglevel=error)
export BUILD_DIR=${BUILD_DIR:-$root/build-release}
BUILD_TYPE=Release bash "$root/scripts/build.sh" >/dev/null
export CI_BUILD_DIR=$BUILD_DIR CI_SOURCE_DIR=$root
exec node "$root/bench/$what.mjs" "$@"
