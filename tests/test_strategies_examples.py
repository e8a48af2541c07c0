"""The examples train to a good accuracy (run in-process, briefly), and the multi-worker
variant runs under ``pycollective run``."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import pycollective as pc

pytest.importorskip("sklearn", reason="the examples need scikit-learn (pip install scikit-learn)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> dict:
    sys.path.insert(0, str(EXAMPLES))
    try:
        return runpy.run_path(str(EXAMPLES / name))
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "argv, floor",
    [
        (["--model", "softmax", "--replicas", "4", "--epochs", "3"], 0.9),
        (["--model", "mlp", "--replicas", "3", "--epochs", "3"], 0.9),
        (["--model", "mlp", "--replicas", "2", "--epochs", "2", "--optimizer", "sgd"], 0.8),
    ],
)
def test_train_digits(capsys, argv, floor):
    accuracy = load("train_digits.py")["main"](argv)
    out = capsys.readouterr().out
    assert "epoch   1  train loss" in out and "test accuracy" in out
    assert accuracy >= floor, out


@pytest.mark.timeout(120)
def test_train_digits_torch(capsys):
    pytest.importorskip("torch")
    accuracy = load("train_digits_torch.py")["main"](["--replicas", "2", "--epochs", "3"])
    assert accuracy >= 0.9, capsys.readouterr().out


def _train_multi_worker(*extra: str, **env_vars: str) -> tuple[float, str]:
    """examples/train_digits.py --multi-worker on 2 workers; its final accuracy and output."""
    cmd = [sys.executable, "-m", "pycollective.cli", "run", "-n", "2", "--timeout", "90"]
    cmd += [sys.executable, str(EXAMPLES / "train_digits.py"), "--multi-worker", *extra]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYCOLLECTIVE_TIMEOUT="30", **env_vars)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    final = [line for line in out.splitlines() if "[rank 0] final test accuracy" in line]
    assert final, out[-4000:]
    return float(final[-1].split()[-1]), out


@pytest.mark.timeout(120)
def test_train_digits_multi_worker():
    if not hasattr(pc, "init"):
        pytest.skip("pycollective has no process groups (pycollective.init) in this build")
    _, out = _train_multi_worker("--epochs", "2", PYCOLLECTIVE_CPU_REPLICAS="2")
    assert "[rank 0] MultiWorkerMirroredStrategy: 4 replicas" in out, out[-4000:]


@pytest.mark.timeout(240)
def test_train_digits_compressed_reaches_the_uncompressed_accuracy():
    """2 workers over tcp (every gradient crosses a network link as bfloat16), with error
    feedback, against the same training uncompressed: 2 replicas in this process, which train
    exactly as 2 workers of one replica do (float32 sums of the same global batches)."""
    args = ("--epochs", "2")
    plain = load("train_digits.py")["main"](["--replicas", "2", *args])
    compressed, out = _train_multi_worker(
        *args,
        "--compress",
        "bf16",
        "--error-feedback",
        PYCOLLECTIVE_CPU_REPLICAS="1",
        PYCOLLECTIVE_TRANSPORT="tcp",
    )
    assert compressed >= plain - 0.01, (plain, compressed, out[-3000:])
