#!/usr/bin/env bash
# The native tests (tests/native/CMakeLists.txt) under ctest, in an AddressSanitizer and
# UndefinedBehaviorSanitizer build of the core: the reduction kernels at every instruction set
# this CPU has, the shm transport and the host segment, the tcp wire (and its fuzzer of frames and encrypted records),
# and every algorithm on a fake device. CPU-only (the fake device needs no CUDA).
#   SANITIZE=thread bash .ci/native_tests.sh    # or none: SANITIZE=
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build/ctest}"
cmake -S . -B "$build" -G Ninja -DPYCOLLECTIVE_BUILD_PYTHON=OFF -DPYCOLLECTIVE_BUILD_TESTS=ON \
  -DPYCOLLECTIVE_CUDA=OFF -DPYCOLLECTIVE_WERROR=ON -DPYCOLLECTIVE_SANITIZE="${SANITIZE-address,undefined}"
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
