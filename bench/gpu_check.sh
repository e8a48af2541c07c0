#!/usr/bin/env bash
# Every GPU check in one run, on a machine with an NVIDIA GPU (a few minutes on one GPU):
#   1. build pycollective with PYCOLLECTIVE_CUDA=ON (editable install into build/gpu-check);
#   2. the device-path check without CUDA (ctest's device_path, fake device);
#   3. every GPU test: pytest -m "gpu or nccl" over tests/, plus the NCCL loader tests;
#   4. the GPU benchmark (bench/gpu_bench.py): kernels vs device copy on 1 GiB float32/bf16,
#      4 replicas on one GPU over device buffers, NCCL through our binding vs CuPy's.
# Everything is written to $OUT (default bench/results/gpu-<date>): gpu_check.log (all output),
# build.log, one junit .xml per test file, gpu_bench.json, summary.txt. The exit code is nonzero
# if any step failed.
#
#   bench/gpu_check.sh                        everything
#   GPU_CHECK_SKIP_BUILD=1 bench/gpu_check.sh use the build already installed
#   GPU_CHECK_QUICK=1 bench/gpu_check.sh      small benchmark sizes
#   CUDA_ARCHS=90 bench/gpu_check.sh          compile only for this architecture (faster)
#   GPU_CHECK_SKIP_NATIVE=1 bench/gpu_check.sh skip step 2 (CI runs it on every commit)
#
# Each test file runs in its own pytest under a per-test deadline (GPU_CHECK_TEST_TIMEOUT,
# default 180 s): a hung collective ends that file's run, not the whole check.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/bench/results/gpu-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu_check.log") 2>&1

python="${PYTHON:-$(command -v python || command -v python3)}"  # images with only python3 too
# `pytest`, not `python -m pytest`: the latter would put the source folder (no _C) first.
pytest="${PYTEST:-pytest}"
status=0
summary=()
step() { echo; echo "== $* ($(date +%T))"; }
record() {  # record NAME EXIT_CODE SECONDS
  local verdict=ok
  [[ $2 -ne 0 ]] && verdict="FAILED (exit $2)" && status=1
  summary+=("$(printf '%-12s %-18s %4ss' "$1" "$verdict" "$3")")
}

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi: none"
command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: not on PATH"
"$python" -c "import sys; print(sys.version)"
"$python" - <<'EOF'
import importlib.util
for m in ("cupy", "torch", "ml_dtypes", "pytest"):
    print(f"  {m}: {'yes' if importlib.util.find_spec(m) else 'no'}")
EOF

if [[ -z "${GPU_CHECK_SKIP_BUILD:-}" ]]; then
  step "build: PYCOLLECTIVE_CUDA=ON (log: $out/build.log)"
  t0=$SECONDS
  defines=()
  [[ -n "${CUDA_ARCHS:-}" ]] && defines=(-Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
  PYCOLLECTIVE_CUDA=ON PYCOLLECTIVE_WERROR=ON "$python" -m pip install --no-build-isolation \
    --no-deps -e . -Cbuild-dir=build/gpu-check "${defines[@]}" >"$out/build.log" 2>&1
  rc=$?
  record build $rc $((SECONDS - t0))
  if [[ $rc -ne 0 ]]; then
    tail -40 "$out/build.log"
    echo "build failed: nothing else can run"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    exit 1
  fi
  grep -E "pycollective: |Built|Successfully" "$out/build.log" | head -5
fi
# Outside the source tree, so the installed package (with _C) is what gets imported.
(cd /tmp && "$python" -c "import pycollective as pc; print(pc.build_info()); \
print(pc._C.cuda_describe())") || status=1

if [[ -z "${GPU_CHECK_SKIP_NATIVE:-}" ]]; then
  step "device path on a fake device (no CUDA involved)"
  t0=$SECONDS
  SANITIZE= BUILD_DIR=build/gpu-check-ctest bash .ci/native_tests.sh
  record device-path $? $((SECONDS - t0))
fi

step "GPU tests"
t0=$SECONDS
deadline="--timeout=${GPU_CHECK_TEST_TIMEOUT:-180}"
rc=0
# pytest-timeout's thread method ends the whole pytest process at a deadline, so each file
# gets its own run ($file unquoted: one entry holds two files).
# shellcheck disable=SC2086
for file in tests/test_cuda.py "tests/test_nccl_loader.py tests/test_build.py"; do
  name=$(basename "${file%% *}" .py)
  $pytest -p no:cacheprovider -rs -v "$deadline" --junitxml="$out/$name.xml" $file
  rc=$((rc | $?))
done
# Any test elsewhere that carries the markers, too.
others=$(grep -l -E "pytest.mark.(gpu|nccl)" tests/*.py | grep -v -E "test_cuda.py" || true)
for file in $others; do
  $pytest -p no:cacheprovider -rs -v -m "gpu or nccl" "$deadline" "$file"
  rc=$((rc | $?))
done
record gpu-tests $rc $((SECONDS - t0))

step "GPU benchmark"
t0=$SECONDS
quick=()
[[ -n "${GPU_CHECK_QUICK:-}" ]] && quick=(--quick)
(cd /tmp && "$python" "$root/bench/gpu_bench.py" --out "$out/gpu_bench.json" "${quick[@]}")
record gpu-bench $? $((SECONDS - t0))

step "summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
echo "results in $out"
exit $status
