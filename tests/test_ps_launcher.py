"""``pycollective run --ps N --workers M``: a whole parameter-server cluster on this machine,
with examples/ps_train_digits.py as the chief (also the end-to-end test of that example)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pycollective import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ps_train_digits.py")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PYCOLLECTIVE_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cluster_environments():
    ports = [6000 + i for i in range(6)]  # only written into the environments
    envs = launcher.ps_cluster_environments(2, 3, base={}, ports=ports)
    assert [(job, i) for job, i, _ in envs] == [
        ("chief", 0),
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    tokens = {env["PYCOLLECTIVE_TOKEN"] for _, _, env in envs}
    assert len(tokens) == 1 and len(tokens.pop()) == 32
    import json

    config = json.loads(envs[3][2]["TF_CONFIG"])
    assert config["task"] == {"type": "worker", "index": 0}
    assert sorted(config["cluster"]) == ["chief", "ps", "worker"]
    assert len({a for tasks in config["cluster"].values() for a in tasks}) == 6  # distinct


@pytest.mark.timeout(60)
def test_example_trains_on_a_local_cluster():
    result = run(
        "--ps",
        "2",
        "--workers",
        "2",
        "--timeout",
        "50",
        sys.executable,
        EXAMPLE,
        "--update-mode",
        "sync",
        "--epochs",
        "2",
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for label in ("[ps 0]", "[ps 1]", "[worker 0]", "[worker 1]", "[chief]"):
        assert label in out
    assert "2 ps, 2 workers, sync updates" in out
    accuracy = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    assert accuracy > 0.85, out


@pytest.mark.timeout(30)
def test_chief_exit_code_and_arguments():
    result = run("--ps", "1", "--workers", "1", sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 3, result.stderr
    result = run("--ps", "1", sys.executable, "-c", "pass")
    assert result.returncode == 2 and "--workers" in result.stderr
    result = run(sys.executable, "-c", "pass")
    assert result.returncode == 2 and "-n 4" in result.stderr
