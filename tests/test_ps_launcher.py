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


# The chief of the next test: kills ps 0, waits for the launcher to restart it, kills it again.
_KILL_TWICE = """
import json, os, signal, socket, sys, time
sys.path.insert(0, sys.argv[1])
from cluster_tasks import task_pid
host, port = json.loads(os.environ["TF_CONFIG"])["cluster"]["ps"][0].rsplit(":", 1)

def new_pid(old):
    # the pid of ps 0 once a new process serves its address
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid = task_pid("ps", 0)
        if pid is not None and pid != old:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return pid
            except OSError:
                pass
        time.sleep(0.05)
    return None

first = new_pid(None)
os.kill(first, signal.SIGKILL)
second = new_pid(first)
print("restarted", second is not None and second != first, flush=True)
os.kill(second, signal.SIGKILL)
time.sleep(3)  # the launcher has no restart left: ps 0 stays down
print("after the second kill", task_pid("ps", 0), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the chief finds the ps in /proc")
@pytest.mark.timeout(90)
def test_max_restarts_restarts_a_lost_task_on_its_address_within_the_bound():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    result = run(
        "--ps",
        "1",
        "--workers",
        "1",
        "--max-restarts",
        "1",
        "--timeout",
        "80",
        sys.executable,
        "-c",
        _KILL_TWICE,
        tests_dir,
        timeout=85,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "[chief] restarted True" in out, out
    assert "ps 0 was killed by SIGKILL; restarted it on its address (0 restart(s) left)" in out
    assert "ps 0 was killed by SIGKILL; the chief continues" in out, out
    assert "[chief] after the second kill None" in out, out
    # The restarted task served the address of the first one: the chief saw a new pid and then
    # connected to ps 0's address. (Its own "serving on" line may be missing: the chief kills
    # it once the port accepts, which can be before that line is printed.)
    served = re.findall(r"\[ps 0\] .* serving on (\S+)", out)
    assert served and all(address == served[0] for address in served), out
