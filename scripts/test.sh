#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, builds
# with ASan and UBSan, and runs every test (unit, integration against a real
# nats-server, sandbox, object-store interop with nats.js). Run as root, or
# with sudo, so that the sandbox can map its unprivileged user.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Each stage says how long it took (the suite must stay well under 20 min).
stage() { echo "== $1 ($((SECONDS - t0)) s)"; t0=$SECONDS; }
t0=$SECONDS
bash scripts/install-deps.sh
# npm ci waits on the registry more than on the CPU: beside the ASan build.
npm_log=$(mktemp)
(cd tests/integration && npm ci --no-audit --no-fund --loglevel=error) >"$npm_log" 2>&1 &
npm_pid=$!
trap 'kill $npm_pid 2>/dev/null || true' EXIT

export BUILD_DIR=${BUILD_DIR:-$root/build}
SANITIZE=1 bash scripts/build.sh
npm_status=0
wait $npm_pid || npm_status=$?
cat "$npm_log"
rm -f "$npm_log"
if [ $npm_status != 0 ]; then echo "== npm ci in tests/integration failed (exit $npm_status)"; exit 1; fi
stage "dependencies installed, built with ASan and UBSan"

# Two more builds that are only built, never run before the fuzzing below:
# the libFuzzer targets (they need clang: their own build, only those
# targets), and all targets, tests included, with clang and with gcc at -O0
# without sanitizers (warnings are errors in every build type, and gcc warns
# differently at -O0; scripts/build-matrix.sh without arguments builds all
# 16 combinations). They run beside the tests at nice 19, in a process group
# of their own (set -m), so that they take the CPU the tests leave idle (the
# integration tests wait on NATS, timers and sleeps much of the time) and
# little else; once the tests are done they get their normal priority back
# (renice), so that a machine busy with something else still finishes them
# in the time it took when they ran alone. Their output is shown after the
# tests.
fuzz_dir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
builds_log=$(mktemp)
set -m
nice -n 19 bash -c '
  set -uo pipefail
  fuzz_ok=1
  start=$SECONDS
  if CC=clang cmake -S "$1" -B "$2" -DCI_FUZZ=ON -DCI_FUZZ_SECONDS="$3" >/dev/null &&
     cmake --build "$2" -j"$(nproc)" --target fuzz_config fuzz_objmeta fuzz_request fuzz_heartbeat fuzz_batch; then
    echo "== fuzz targets built in $((SECONDS - start)) s"
  else
    echo "== fuzz targets: build FAILED"
    fuzz_ok=0
  fi
  bash "$1/scripts/build-matrix.sh" clang:Debug gcc:Debug
  matrix=$?
  # 0: all built; 1: the matrix failed; 2: the fuzz targets did (3: both).
  exit $(( (matrix != 0) + 2 * (1 - fuzz_ok) ))
' builds "$root" "$fuzz_dir" "${CI_FUZZ_SECONDS:-30}" >"$builds_log" 2>&1 &
builds_pid=$!
set +m
# The script stopped before it waited: the builds go with it.
trap 'kill -- -$builds_pid 2>/dev/null || true; rm -f "$builds_log"' EXIT
trap 'exit 130' INT TERM

# nats.c keeps some library-lifetime memory until nats_Close; the
# suppressions list only that, so that any leak of ours still fails.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j2 "$@") || status=$?
stage "tests"

renice -n 0 -g $builds_pid >/dev/null 2>&1 || true
builds_status=0
wait $builds_pid || builds_status=$?
trap - EXIT
cat "$builds_log"
rm -f "$builds_log"
stage "fuzz targets, clang and gcc Debug builds (beside the tests, then waited for)"
if [ $builds_status != 0 ]; then status=1; fi

if [ $builds_status = 0 ] || [ $builds_status = 1 ]; then
  echo "== fuzzing each parser for ${CI_FUZZ_SECONDS:-30} s"
  (cd "$fuzz_dir" && ctest --output-on-failure -j2 -R '^fuzz\.') || status=$?
  stage "fuzzing"
fi
exit $status
