"""Smoke tests of an installed pycollective: what a wheel must do on a machine with no compiler,
no CUDA and nothing but numpy, grpcio and protobuf beside it. The wheel job (.ci/wheel_job.sh)
and cibuildwheel run this file against the wheel; the full suite runs it too."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import pycollective as pc

CLI = os.path.join(os.path.dirname(sys.executable), "pycollective")


def test_import_maps_neither_cuda_runtime_nor_nccl():
    """A CUDA build links the CUDA runtime statically and opens NCCL on first use, so importing
    works on a machine without either (the wheel's promise)."""
    with open("/proc/self/maps") as f:
        mapped = f.read()
    assert "libcudart" not in mapped and "libnccl" not in mapped
    info = pc.build_info()
    assert info["version"] == pc.__version__ and isinstance(info["cuda"], bool)


def test_strategies_subpackage_ships():
    from pycollective.strategies import MirroredStrategy, ReduceOp

    strategy = MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2 and ReduceOp.SUM is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("algo", ["ring", "halving_doubling", "direct", "auto"])
def test_in_process_allreduce_matches_numpy(dtype, algo):
    rng = np.random.default_rng(7)
    xs = [(rng.standard_normal(1001) * 10).astype(dtype) for _ in range(3)]
    ys = pc.LocalCommunicator(3).allreduce(xs, op="sum", algo=algo)
    expected = np.sum(np.stack(xs).astype(np.float64), axis=0)
    for y in ys:
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.timeout(90)
def test_two_processes_over_shm_match_numpy(tmp_path):
    program = (
        "import numpy as np, pycollective as pc\n"
        "pc.init()\n"
        "r, n = pc.rank(), pc.world_size()\n"
        "x = np.arange(10007, dtype=np.float32) * (r + 1)\n"
        "assert np.array_equal(pc.allreduce(x), np.arange(10007, dtype=np.float32) * 3)\n"
        "g = pc.allgather(np.full(5, r, np.int64))\n"
        "assert np.array_equal(g, np.repeat(np.arange(n), 5).reshape(n, 5)), g\n"
        "assert np.array_equal(pc.broadcast(np.full(3, r + 7.0), root=1), np.full(3, 8.0))\n"
        "print('ok', r)\n"
        "pc.shutdown()\n"
    )
    script = tmp_path / "smoke.py"
    script.write_text(program)
    res = subprocess.run(
        [CLI, "run", "-n", "2", "--timeout", "60", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=80,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[rank 0] ok 0" in res.stdout and "[rank 1] ok 1" in res.stdout


@pytest.mark.timeout(60)
def test_doctor_runs(tmp_path):
    res = subprocess.run([CLI, "doctor"], capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"version: {pc.__version__}" in res.stdout and "transports:" in res.stdout
