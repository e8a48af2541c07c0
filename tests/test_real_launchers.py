"""The launchers people run, for real: Slurm's srun and sbatch and Open MPI's mpirun start
examples/allreduce_check.py (and the digits example), which join one group from the
launcher's environment alone and check an all-reduce against numpy. No token, no address, no
setup: every rank is on this host (docs/launching.md).

Where srun (with a Slurm cluster that answers) or mpirun is missing, the test skips and says
so. CI installs both and sets CI_REQUIRE_LAUNCHERS=slurm,mpirun (.ci/launchers_up.sh starts the
cluster): there, a missing launcher fails the test instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "examples", "allreduce_check.py")
SBATCH_EXAMPLE = os.path.join(ROOT, "examples", "slurm_digits.sbatch")
DEADLINE = 90

pytestmark = pytest.mark.timeout(DEADLINE + 30)


def _required(engine: str) -> bool:
    return engine in os.environ.get("CI_REQUIRE_LAUNCHERS", "").split(",")


def _unavailable(engine: str, reason: str) -> None:
    if _required(engine):
        pytest.fail(f"{reason}, but CI_REQUIRE_LAUNCHERS names {engine}")
    pytest.skip(reason)


def _need_slurm() -> None:
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        _unavailable(
            "slurm", "srun is not installed (apt-get install slurm-client; .ci/launchers_up.sh)"
        )
    states = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20
    ).stdout.split()
    if not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        _unavailable("slurm", "no Slurm node answers (start one with .ci/launchers_up.sh as root)")


def _need_mpirun() -> None:
    if shutil.which("mpirun") is None:
        _unavailable("mpirun", "mpirun is not installed (apt-get install openmpi-bin)")


@pytest.fixture
def user_env(tmp_path):
    """The environment of a user who did no setup: no token, no coordinator, an empty home
    (so no token file either); this interpreter first on PATH, as in an activated venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYCOLLECTIVE_", "OMPI_", "PMIX_", "SLURM_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TF_CONFIG")
    }
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYCOLLECTIVE_CONNECT_TIMEOUT"] = "60"
    return env


def _reports(command: list[str], env: dict[str, str]) -> list[dict]:
    res = subprocess.run(
        command, capture_output=True, text=True, timeout=DEADLINE, env=env, cwd=ROOT
    )
    assert res.returncode == 0, f"{command} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    # mpirun forwards every rank's output as it comes: two lines may share one.
    reports = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", res.stdout)]
    return sorted(reports, key=lambda r: r["rank"])


def _assert_one_group(reports: list[dict], n: int) -> None:
    assert [r["rank"] for r in reports] == list(range(n))
    for r in reports:
        assert r["world_size"] == n and r["local_size"] == n
        assert r["ok"], f"rank {r['rank']}: all-reduce differs from numpy for {r['mismatches']}"
    assert sorted(r["local_rank"] for r in reports) == list(range(n))


def test_srun_four_ranks_form_one_group(user_env):
    _need_slurm()
    # --overcommit: 4 tasks on the 2 CPUs of a CI node (Slurm gives each task a CPU otherwise).
    command = ["srun", "-n", "4", "--overcommit", "--time=2", "python", CHECK]
    _assert_one_group(_reports(command, user_env), 4)


def test_mpirun_four_ranks_form_one_group(user_env):
    _need_mpirun()
    command = ["mpirun", "-n", "4", "--oversubscribe"]
    if os.getuid() == 0:
        command.append("--allow-run-as-root")  # Open MPI refuses root without it
    _assert_one_group(_reports(command + ["python", CHECK], user_env), 4)


_MPI_AFTER_INIT = """
import json, numpy as np, pycollective as pc
pc.init()
from mpi4py import MPI  # MPI_Init holds the GIL until every rank reaches it
x = np.full(3, pc.rank() + 1.0, np.float32)
ours, theirs = pc.allreduce(x), np.empty_like(x)
MPI.COMM_WORLD.Allreduce(x, theirs)
n = pc.world_size()
print(json.dumps({"rank": pc.rank(), "ok": bool((ours == theirs).all() and ours[0] == n * (n + 1) / 2)}))
pc.shutdown()
"""


def test_mpirun_ranks_that_start_mpi_after_init(user_env, tmp_path):
    """A script that calls pc.init() and then imports mpi4py: rank 0 (the coordinator's host)
    must not reach MPI_Init while another rank still needs the coordinator to finish init."""
    _need_mpirun()
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    script = tmp_path / "mpi_after_init.py"
    script.write_text(_MPI_AFTER_INIT)
    command = ["mpirun", "-n", "4", "--oversubscribe"]
    if os.getuid() == 0:
        command.append("--allow-run-as-root")
    reports = _reports(command + ["python", str(script)], user_env)
    assert [(r["rank"], r["ok"]) for r in reports] == [(r, True) for r in range(4)], reports


def test_sbatch_runs_the_documented_job_script(user_env, tmp_path):
    _need_slurm()
    pytest.importorskip("sklearn", reason="the digits example loads its data with scikit-learn")
    with open(SBATCH_EXAMPLE) as f, open(os.path.join(ROOT, "docs", "launching.md")) as docs:
        assert f.read() in docs.read(), "docs/launching.md does not show the job script"
    output = tmp_path / "digits.out"
    # As the docs say to run it; --output keeps its log here.
    command = ["sbatch", "--parsable", f"--output={output}", SBATCH_EXAMPLE]
    res = subprocess.run(
        command, capture_output=True, text=True, timeout=DEADLINE, env=user_env, cwd=ROOT
    )
    assert res.returncode == 0, f"sbatch exited {res.returncode}:\n{res.stderr}"
    job = res.stdout.strip().split(";")[0]
    # Polled here rather than with sbatch --wait, whose backoff adds seconds after the job ends.
    deadline = time.monotonic() + DEADLINE
    while _job_state(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    state = _job_state(job)
    if state:
        subprocess.run(["scancel", job], timeout=20)
    log = output.read_text() if output.exists() else "(no output file)"
    assert not state, f"job {job} still {state} after {DEADLINE} s; cancelled:\n{log}"
    accuracy = [ln for ln in log.splitlines() if "test accuracy" in ln]
    assert accuracy, log
    assert float(accuracy[-1].rsplit(" ", 1)[1]) > 0.85, log


def _job_state(job: str) -> str:
    """The job's state while Slurm still lists it ("" once it has ended)."""
    res = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20
    )
    return res.stdout.strip()
