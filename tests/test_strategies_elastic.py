"""MultiWorkerMirroredStrategy through a worker loss, in the same processes: 3 workers train
digits (examples/train_digits_elastic.py under ``pycollective run -n MIN:MAX``), one is SIGKILLed
at a random step, the others re-form the group (smaller, or with a replacement), restore the
newest backup and finish the planned steps. The final parameters must equal those of an
uninterrupted run that resumed from the same backup with the same world size.

The kill's step and rank are random; the seed is in every failure message (set
PYCOLLECTIVE_TEST_SEED to replay one).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_launcher import launcher_env

pytest.importorskip(
    "sklearn", reason="the digits trainer needs scikit-learn (pip install scikit-learn)"
)

TRAINER = str(Path(__file__).resolve().parents[1] / "examples" / "train_digits_elastic.py")
STEPS, SAVE_FREQ = 60, 10


def launch(*launch_args: str, trainer_args: list[str], timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", *launch_args]
        + ["--timeout", str(timeout - 10), sys.executable, TRAINER]
        + ["--steps", str(STEPS), "--save-freq", str(SAVE_FREQ), *trainer_args],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "launch_args, world_after",
    [(("-n", "2:3"), 2), (("-n", "3", "--max-restarts", "1"), 3)],
    ids=["shrink", "replacement"],
)
def test_training_survives_a_sigkill(tmp_path, launch_args, world_after):
    seed = int(os.environ.get("PYCOLLECTIVE_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    kill_at, kill_rank = rng.randrange(SAVE_FREQ + 1, STEPS - 1), rng.randrange(3)
    what = f"seed {seed}: rank {kill_rank} killed at step {kill_at}"
    backups = tmp_path / "backup"
    backups.mkdir()
    faulted = launch(
        *launch_args,
        trainer_args=["--backup-dir", str(backups), "--keep", "100", "--out", str(tmp_path / "f")]
        + ["--kill-at", str(kill_at), "--kill-rank", str(kill_rank), "--min-workers", "2"],
    )
    assert faulted.returncode == 0, f"{what}\n{faulted.stderr[-4000:]}"
    assert "was killed by SIGKILL" in faulted.stderr, what
    report = json.loads((tmp_path / "f.json").read_text())
    assert report["world_size"] == world_after, what
    [recovery] = report["recoveries"]
    assert recovery["failed_step"] == kill_at and recovery["num_workers"] == world_after, what
    restored = recovery["checkpoint"]
    assert recovery["restored_step"] == (kill_at // SAVE_FREQ) * SAVE_FREQ, what
    # The reference: no failure, the same backup, the same world size.
    reference = launch(
        "-n",
        str(world_after),
        trainer_args=["--resume-from", restored, "--out", str(tmp_path / "r")],
    )
    assert reference.returncode == 0, f"{what}\n{reference.stderr[-4000:]}"
    got, want = np.load(tmp_path / "f.npz"), np.load(tmp_path / "r.npz")
    assert sorted(got.files) == sorted(want.files)
    for name in want.files:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=what)
    # ... and training did something: the parameters moved off their zero start.
    assert np.abs(want["p0"]).max() > 0.01


@pytest.mark.timeout(400)
def test_preemption_saves_at_one_step_and_the_restart_finishes_the_same(tmp_path):
    """A SIGTERM to one worker: both save at the same step and exit 42 (tf's restart code);
    the next launch resumes there; the result equals an uninterrupted run's."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    common = ["--handler", "preemption", "--backup-dir", str(ckpt)]
    preempted = launch("-n", "2", trainer_args=common + ["--term-at", "23", "--term-rank", "1"])
    assert preempted.returncode == 42, preempted.stderr[-4000:]
    saved = sorted(p.name for p in ckpt.glob("ckpt-*.npz"))
    assert "ckpt-24.npz" in saved, saved  # step 23 ran, then every worker saved before 24
    resumed = launch("-n", "2", trainer_args=common + ["--out", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    fresh = launch(
        "-n",
        "2",
        trainer_args=["--handler", "preemption", "--backup-dir", str(fresh_dir)]
        + ["--out", str(tmp_path / "fresh")],
    )
    assert fresh.returncode == 0, fresh.stderr[-4000:]
    got, want = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "fresh.npz")
    for name in want.files:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)
