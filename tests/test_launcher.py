"""``pycollective run``: environment, tagged output, failure, timeout and signal handling.

Each test runs the real launcher (``python -m pycollective.cli run``) as a
child process under a bounded wait; the launcher's own children are checked
to be gone afterwards.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pycollective.rendezvous as rdv
from pycollective import launcher

_PACKAGE_ROOT = str(Path(rdv.__file__).resolve().parents[2])


def launcher_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLLECTIVE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [_PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.update(extra)
    return env


def run(*args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", *args],
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def by_rank(output: str, marker: str) -> dict[int, str]:
    """Maps rank -> the rest of its line that follows ``marker``."""
    found = {}
    for line in output.splitlines():
        prefix, _, rest = line.partition("] ")
        if prefix.startswith("[rank ") and rest.startswith(marker):
            found[int(prefix[len("[rank ") :])] = rest[len(marker) :]
    return found


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


PRINT_ENV = r"""
import json, os
keys = [k for k in os.environ if k.startswith("PYCOLLECTIVE_")] + ["TF_CONFIG"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
from pycollective.rendezvous import ClusterSpec
s = ClusterSpec.from_env()
print("SPEC " + json.dumps([s.rank, s.world_size, s.local_rank, s.local_size, s.master, s.host_id]))
"""


@pytest.mark.timeout(60)
def test_each_rank_gets_its_environment():
    result = run("-n", "3", sys.executable, "-c", PRINT_ENV)
    assert result.returncode == 0, result.stderr
    envs = {rank: json.loads(text) for rank, text in by_rank(result.stdout, "ENV ").items()}
    assert sorted(envs) == [0, 1, 2]
    port = envs[0]["PYCOLLECTIVE_MASTER_PORT"]
    tokens = {env["PYCOLLECTIVE_TOKEN"] for env in envs.values()}
    assert len(tokens) == 1 and len(tokens.pop()) == 32
    for rank, env in envs.items():
        assert env["PYCOLLECTIVE_RANK"] == str(rank)
        assert env["PYCOLLECTIVE_WORLD_SIZE"] == "3"
        assert env["PYCOLLECTIVE_LOCAL_RANK"] == str(rank)
        assert env["PYCOLLECTIVE_LOCAL_SIZE"] == "3"
        assert env["PYCOLLECTIVE_MASTER_ADDR"] == "127.0.0.1"
        assert env["PYCOLLECTIVE_MASTER_PORT"] == port
        assert "PYCOLLECTIVE_HOST_ID" not in env
        tf_config = json.loads(env["TF_CONFIG"])
        assert tf_config["task"] == {"type": "worker", "index": rank}
        workers = tf_config["cluster"]["worker"]
        assert len(set(workers)) == 3 and workers[0] == f"127.0.0.1:{port}"
    specs = {rank: json.loads(text) for rank, text in by_rank(result.stdout, "SPEC ").items()}
    for rank, (r, world, local_rank, local_size, master, _) in specs.items():
        assert (r, world, local_rank, local_size) == (rank, 3, rank, 3)
        assert master == f"127.0.0.1:{port}"


@pytest.mark.timeout(60)
def test_host_ids_fake_several_hosts():
    result = run("-n", "4", "--host-ids", "a,a,b,b", sys.executable, "-c", PRINT_ENV)
    assert result.returncode == 0, result.stderr
    specs = {rank: json.loads(text) for rank, text in by_rank(result.stdout, "SPEC ").items()}
    assert [specs[r][2:4] for r in range(4)] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert [specs[r][5] for r in range(4)] == ["a", "a", "b", "b"]


@pytest.mark.timeout(60)
def test_a_token_in_the_environment_is_kept():
    result = run("-n", "2", sys.executable, "-c", PRINT_ENV, PYCOLLECTIVE_TOKEN="mine")
    envs = [json.loads(text) for text in by_rank(result.stdout, "ENV ").values()]
    assert [env["PYCOLLECTIVE_TOKEN"] for env in envs] == ["mine", "mine"]


@pytest.mark.timeout(60)
def test_output_is_prefixed_per_line_and_streams_stay_apart():
    code = (
        "import os, sys\n"
        "r = os.environ['PYCOLLECTIVE_RANK']\n"
        "for i in range(50): print(f'out {r} {i}')\n"
        "print(f'err {r}', file=sys.stderr)\n"
        "sys.stdout.write(f'partial {r}')\n"
    )
    result = run("-n", "3", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    out_lines = result.stdout.splitlines()
    assert len(out_lines) == 3 * 51
    for rank in range(3):
        mine = [line for line in out_lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] out {rank} {i}" for i in range(50)] + [
            f"[rank {rank}] partial {rank}"
        ]
    assert sorted(result.stderr.splitlines()) == [f"[rank {r}] err {r}" for r in range(3)]


@pytest.mark.timeout(60)
def test_no_tag_output():
    # Untagged, the ranks write straight to the launcher's stdout, as mpirun's do: a line is
    # whole when written in one call (print() writes text and newline apart, which two
    # unbuffered ranks can interleave: PYTHONUNBUFFERED=1 in the environment).
    line = "import sys; sys.stdout.write('plain\\n')"
    result = run("-n", "2", "--no-tag-output", sys.executable, "-c", line)
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["plain", "plain"]


SLEEPER = r"""
import os, sys, time
rank = int(os.environ["PYCOLLECTIVE_RANK"])
print("PID", os.getpid(), flush=True)
time.sleep(0.5)
if rank == int(sys.argv[1]):
    sys.exit(int(sys.argv[2])) if sys.argv[2] != "KILL" else os.kill(os.getpid(), 9)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_failing_rank_stops_the_others_and_sets_the_exit_code():
    start = time.monotonic()
    result = run("-n", "3", sys.executable, "-c", SLEEPER, "1", "3")
    assert time.monotonic() - start < 40  # the others were stopped, not left to sleep 60 s
    assert result.returncode == 3
    assert "pycollective run: rank 1 exited with code 3; stopped the other ranks" in result.stderr
    pids = [int(text) for text in by_rank(result.stdout, "PID ").values()]
    assert len(pids) == 3
    assert_gone(pids)


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_is_named():
    result = run("-n", "2", sys.executable, "-c", SLEEPER, "0", "KILL")
    assert result.returncode == 128 + signal.SIGKILL
    assert (
        "pycollective run: rank 0 was killed by SIGKILL; stopped the other ranks" in result.stderr
    )


@pytest.mark.timeout(60)
def test_timeout_stops_everything_with_124():
    start = time.monotonic()
    result = run("-n", "2", "--timeout", "1", sys.executable, "-c", SLEEPER, "-1", "0")
    assert time.monotonic() - start < 40  # stopped at --timeout, not after the ranks' 60 s
    assert result.returncode == 124
    assert "pycollective run: timed out after 1 s; stopped all ranks" in result.stderr
    assert_gone([int(text) for text in by_rank(result.stdout, "PID ").values()])


@pytest.mark.timeout(60)
def test_sigterm_to_the_launcher_stops_the_children():
    proc = subprocess.Popen(
        [sys.executable, "-m", "pycollective.cli", "run", "-n", "3", "--grace", "2"]
        + [sys.executable, "-c", SLEEPER, "-1", "0"],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 30
        while len(pids) < 3:  # the children print their PID at once
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            pids += [int(text) for text in by_rank(line, "PID ").values()]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM; forwarded it to all ranks" in stderr
    assert_gone(pids)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0", "prog"], "must be >= 1"),
        (["-n", "2", "--host-ids", "a", "prog"], "--host-ids lists 1 host id(s) but -n is 2"),
        (["-n", "2"], "no program given"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.timeout(30)
def test_missing_program_exits_127():
    result = run("-n", "2", "no-such-program-pycollective")
    assert result.returncode == 127
    assert "cannot start 'no-such-program-pycollective'" in result.stderr


@pytest.mark.timeout(10)
def test_rank_environments_without_launching():
    ports = [5000 + i for i in range(launcher.rank_ports(4))]  # only written into the environments
    envs = launcher.rank_environments(
        4, ["x", "y", "x", "y"], base={"PYCOLLECTIVE_TOKEN": "t"}, ports=ports
    )
    assert [e["PYCOLLECTIVE_LOCAL_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["PYCOLLECTIVE_HOST_ID"] for e in envs] == ["x", "y", "x", "y"]
    assert {e["PYCOLLECTIVE_TOKEN"] for e in envs} == {"t"}
    # Worker 0's TF_CONFIG port is the coordinator's; the last one is torch's env:// store.
    assert {e["PYCOLLECTIVE_MASTER_PORT"] for e in envs} == {"5000"}
    assert {e["MASTER_PORT"] for e in envs} == {"5004"}
