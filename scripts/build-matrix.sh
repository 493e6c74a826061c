#!/usr/bin/env bash
# Builds every target (target all: the tests too) in several configurations,
# to check that each compiles with warnings as errors: gcc and clang warn
# about different things, and gcc's flow-based warnings (format-truncation,
# stringop-*) change with -O and the sanitizers. Only builds; runs nothing.
#
#   scripts/build-matrix.sh [CC:BUILD_TYPE[:san] ...]
#
# e.g. clang:Debug, gcc:Release:san (san: -DCI_SANITIZE=ON). Without
# arguments: all 16 of gcc and clang x Debug, Release, RelWithDebInfo,
# MinSizeRel x with and without the sanitizers. Each goes to
# MATRIX_DIR/CC-TYPE[-san] (default build-matrix/); its output is shown
# only when it fails. Exits 1 when any failed, after trying them all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${MATRIX_DIR:-$root/build-matrix}
combos=("$@")
if [ ${#combos[@]} = 0 ]; then
  for cc in gcc clang; do
    for type in Debug Release RelWithDebInfo MinSizeRel; do combos+=("$cc:$type" "$cc:$type:san"); done
  done
fi
failed=()
for combo in "${combos[@]}"; do
  IFS=: read -r cc type san <<<"$combo"
  case "$san" in
    "") sanitize=OFF ;;
    san) sanitize=ON ;;
    *) echo "build-matrix: $combo: expected CC:BUILD_TYPE[:san]" >&2; exit 2 ;;
  esac
  dir=$out/$cc-$type${san:+-$san}
  mkdir -p "$dir"
  start=$SECONDS
  if { CC=$cc cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DCI_SANITIZE=$sanitize &&
       cmake --build "$dir" -j"$(nproc)"; } >"$dir/build.log" 2>&1; then
    echo "== build $combo: ok in $((SECONDS - start)) s"
  else
    cat "$dir/build.log"
    echo "== build $combo: FAILED (log: $dir/build.log)"
    failed+=("$combo")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== build matrix: ${#failed[@]} of ${#combos[@]} failed: ${failed[*]}"
  exit 1
fi
