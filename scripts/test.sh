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
(cd tests/integration && npm ci --no-audit --no-fund --loglevel=error)
stage "dependencies installed"

export BUILD_DIR=${BUILD_DIR:-$root/build}
SANITIZE=1 bash scripts/build.sh
stage "built with ASan and UBSan"

# nats.c keeps some library-lifetime memory until nats_Close; the
# suppressions list only that, so that any leak of ours still fails.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The libFuzzer targets need clang: their own build, only those targets.
fuzz_dir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
CC=clang cmake -S "$root" -B "$fuzz_dir" -DCI_FUZZ=ON -DCI_FUZZ_SECONDS=${CI_FUZZ_SECONDS:-30} >/dev/null
cmake --build "$fuzz_dir" -j"$(nproc)" --target fuzz_config fuzz_objmeta fuzz_request fuzz_heartbeat fuzz_batch
stage "fuzz targets built"
# Warnings are errors in every build type, with gcc and with clang. Beyond
# the two builds above (gcc -O2 with sanitizers; clang, fuzz targets only),
# build all targets, tests included, with clang and with gcc at -O0 without
# sanitizers (gcc warns differently at -O0). Only built, not run.
# scripts/build-matrix.sh without arguments builds all 16 combinations.
bash scripts/build-matrix.sh clang:Debug gcc:Debug
stage "clang and gcc Debug builds"

cd "$BUILD_DIR"
status=0
ctest --output-on-failure --timeout 600 -j2 "$@" || status=$?
stage "tests"
echo "== fuzzing each parser for ${CI_FUZZ_SECONDS:-30} s"
(cd "$fuzz_dir" && ctest --output-on-failure -j2 -R '^fuzz\.') || status=$?
stage "fuzzing"
exit $status
