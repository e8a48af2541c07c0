#!/usr/bin/env bash
# Builds native tests with the compiler directly, using the same per-file flags as the CMake
# build, and runs them:
#  - test_reduce: the CPU reduction kernels, once per kernel table this CPU supports
#    (PYCOLLECTIVE_SIMD=generic, avx2, avx512);
#  - test_shm: the shared-memory transport, two forked processes per case; it also prints the
#    64 MiB one-way GB/s and the 4 KiB round-trip latency.
#
#   tests/native/build_and_run.sh           correctness checks
#   tests/native/build_and_run.sh --bench   float32 sum GB/s per table vs memcpy; shm GB/s, us
#
# Environment: CXX (default g++), BUILD_DIR (default build/native-test),
# SANITIZE=address|undefined|thread (adds -fsanitize=...), TESTS (default "reduce shm").
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
kernel_objects=("${objects[@]}")
compile tests/native/test_reduce.cc
"$cxx" "${common[@]}" "${objects[@]}" -o "$out/test_reduce"

# The shm transport test: the kernels (it reduces out of the ring) plus the transport, and
# nothing above it (frame.cc names algorithms only through a namer the registry registers).
objects=("${kernel_objects[@]}")
compile csrc/core/logging.cc
compile csrc/transport/frame.cc
compile csrc/transport/shm.cc
compile tests/native/test_shm.cc
# -lrt: shm_open lives there before glibc 2.34 (an empty stub after).
"$cxx" "${common[@]}" "${objects[@]}" -o "$out/test_shm" -lrt

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

tests="${TESTS:-reduce shm}"
status=0
if [[ " $tests " == *" reduce "* ]]; then
  for level in "${levels[@]}"; do
    echo "== PYCOLLECTIVE_SIMD=$level $*"
    PYCOLLECTIVE_SIMD="$level" timeout 900 "$out/test_reduce" "$@" || status=1
  done
fi
if [[ " $tests " == *" shm "* ]]; then
  echo "== test_shm $*"
  timeout 900 "$out/test_shm" "$@" || status=1
fi
exit $status
