#!/usr/bin/env bash
# Quick start on a fresh Debian 12 machine: installs what is missing, builds,
# starts the embedded default (a local nats-server with JetStream plus one
# ci-worker) and runs a real analysis of examples/sales.csv with a chart.
# The service keeps running; `scripts/quickstart.sh stop` stops it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$root/.work
mkdir -p "$work"

stop() {
  # The worker first, and its exit awaited (it drains: at most
  # worker.drain_timeout_s, 90 s), while its NATS server is still there.
  for name in worker nats-server; do
    if [ -f "$work/$name.pid" ]; then
      pid=$(cat "$work/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      rm -f "$work/$name.pid"
    fi
  done
}
if [ "${1:-}" = stop ]; then stop; echo "stopped"; exit 0; fi

bash scripts/install-deps.sh
BUILD_DIR=$root/build-release BUILD_TYPE=Release bash scripts/build.sh >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; exit 1; }
bin=$root/build-release
export CI_NATS_URL=${CI_NATS_URL:-nats://127.0.0.1:4222}

alive() { [ -f "$work/$1.pid" ] && kill -0 "$(cat "$work/$1.pid")" 2>/dev/null; }

if ! alive nats-server; then
  # config/nats-server.conf keeps its store in ./.work/nats of this folder
  nats-server -c config/nats-server.conf >"$work/nats-server.log" 2>&1 &
  echo $! >"$work/nats-server.pid"
  for _ in $(seq 50); do
    grep -q "Server is ready" "$work/nats-server.log" && break
    alive nats-server || { cat "$work/nats-server.log"; exit 1; }
    sleep 0.1
  done
fi
if ! alive worker; then
  "$bin/ci-worker" --config config/worker.yaml >"$work/worker.log" 2>&1 &
  echo $! >"$work/worker.pid"
  for _ in $(seq 100); do
    grep -q '"event":"worker.ready"' "$work/worker.log" && break
    alive worker || { cat "$work/worker.log"; exit 1; }
    sleep 0.1
  done
fi
echo "== nats-server (pid $(cat "$work/nats-server.pid")) and ci-worker (pid $(cat "$work/worker.pid")) are running on $CI_NATS_URL"

out=$work/demo
mkdir -p "$out"
cd "$out"
echo "== ci run examples/sales_report.py --file examples/sales.csv"
"$bin/ci" run "$root/examples/sales_report.py" --file "$root/examples/sales.csv"
echo "== artifacts saved in $out:"
ls -l "$out"
echo "== the service keeps running: submit more with $bin/ci run SCRIPT.py --file DATA.csv"
echo "== stop it with: scripts/quickstart.sh stop"
