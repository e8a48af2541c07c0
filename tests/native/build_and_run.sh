#!/usr/bin/env bash
# Builds the CPU reduction kernels and their native test with the compiler directly, using the
# same per-file flags as the CMake build, then runs the test once per kernel table this CPU
# supports (PYCOLLECTIVE_SIMD=generic, avx2, avx512).
#
#   tests/native/build_and_run.sh           correctness checks
#   tests/native/build_and_run.sh --bench   float32 sum GB/s per table vs memcpy
#
# Environment: CXX (default g++), BUILD_DIR (default build/native-test),
# SANITIZE=address|undefined|thread (adds -fsanitize=...).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${BUILD_DIR:-$root/build/native-test}"
cxx="${CXX:-g++}"
mkdir -p "$out"

common=(-O3 -fPIC -std=c++17 -Wall -Wextra -pthread -I"$root/csrc")
if [[ -n "${SANITIZE:-}" ]]; then
  common+=(-fsanitize="$SANITIZE" -fno-omit-frame-pointer -g)
fi
avx2_flags=(-mavx2 -mfma -mf16c)
avx512_flags=(-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)

case "$(uname -m)" in
  x86_64 | amd64 | i?86) x86=1 ;;
  *) x86=0 ;;  # the dispatcher only references the AVX tables on x86
esac

compile() {
  local src="$1"
  shift
  local obj="$out/$(basename "${src%.cc}").o"
  echo "  $cxx ${common[*]} $* -c $src"
  "$cxx" "${common[@]}" "$@" -c "$root/$src" -o "$obj"
  objects+=("$obj")
}

objects=()
echo "building in $out"
compile csrc/core/thread_pool.cc
compile csrc/reduce/reduce_dispatch.cc
compile csrc/reduce/reduce_cpu_generic.cc
if [[ $x86 == 1 ]]; then
  compile csrc/reduce/reduce_cpu_avx2.cc "${avx2_flags[@]}"
  compile csrc/reduce/reduce_cpu_avx512.cc "${avx512_flags[@]}"
fi
compile tests/native/test_reduce.cc
"$cxx" "${common[@]}" "${objects[@]}" -o "$out/test_reduce"

# Every level up to the best one this CPU supports, in order.
best="$(env -u PYCOLLECTIVE_SIMD "$out/test_reduce" --print-simd)"
levels=()
for level in generic avx2 avx512; do
  levels+=("$level")
  [[ $level == "$best" ]] && break
done
for level in generic avx2 avx512; do
  [[ " ${levels[*]} " == *" $level "* ]] || echo "skipping $level: this CPU lacks it (best: $best)"
done

# An unknown request falls back to the best level, with a warning.
fallback="$(PYCOLLECTIVE_SIMD=bogus "$out/test_reduce" --print-simd 2>"$out/warning.txt")"
if [[ $fallback != "$best" ]] || ! grep -q "PYCOLLECTIVE_SIMD=bogus" "$out/warning.txt"; then
  echo "FAILED: PYCOLLECTIVE_SIMD=bogus gave '$fallback' and warning '$(cat "$out/warning.txt")'"
  exit 1
fi

status=0
for level in "${levels[@]}"; do
  echo "== PYCOLLECTIVE_SIMD=$level $*"
  PYCOLLECTIVE_SIMD="$level" timeout 900 "$out/test_reduce" "$@" || status=1
done
exit $status
