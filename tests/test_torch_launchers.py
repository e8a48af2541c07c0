"""init_process_group("pycollective") under the launchers people use: torchrun (env://) and
`pycollective run`, each training the digits example with DDP, under a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the torch backend needs torch")
pytest.importorskip("sklearn", reason="the digits example loads its data with scikit-learn")

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_digits_ddp.py"
)


def _run(command):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(EXAMPLE))
    env.pop("PYCOLLECTIVE_TOKEN", None)  # the token comes from torch's store or the launcher
    res = subprocess.run(
        command + [EXAMPLE, "--epochs", "2"], capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if "test accuracy" in ln][-1]
    return float(line.rsplit(" ", 1)[1])


def test_torchrun():
    from multiproc import reserve_ports

    with reserve_ports(1) as reserved:  # torchrun's store binds it; nobody else meanwhile
        accuracy = _run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--master_port",
                str(reserved.ports[0]),
            ]
        )
    assert accuracy > 0.85


def test_pycollective_run():
    accuracy = _run(
        [sys.executable, "-m", "pycollective.cli", "run", "-n", "2", "--", sys.executable]
    )
    assert accuracy > 0.85
