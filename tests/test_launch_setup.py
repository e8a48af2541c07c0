"""What a launch needs besides the launcher: the per-user token file (``pycollective token``),
the same-host job file through which srun/mpirun ranks on one host share address and token,
and the choice between them (ClusterSpec.from_env)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from pycollective.cli import main as cli_main
from pycollective.rendezvous import ClusterSpec, RendezvousError, job_file
from pycollective.rendezvous.job_file import SameHostJob
from pycollective.rendezvous.token_file import read_token_file

pytestmark = pytest.mark.timeout(20)

SLURM_ONE_NODE = {
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4",
    "SLURM_JOB_NODELIST": "vm",
    "SLURM_STEP_NODELIST": "vm",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "3",
}
SLURM_TWO_NODES = {
    **SLURM_ONE_NODE,
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
}
OMPI_ONE_HOST = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
    "PMIX_NAMESPACE": "2001862657",
}


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Job files go to a fresh temporary folder (as TMPDIR would choose)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(job_file.tempfile, "gettempdir", lambda: str(folder))
    return folder


def _cli(*argv: str) -> int:
    return cli_main(["token", *argv])


# -- the token file -------------------------------------------------------------------


def test_token_create_writes_an_owner_only_file(home, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYCOLLECTIVE_TOKEN_FILE", raising=False)
    assert _cli() == 0 and "no token file" in capsys.readouterr().out
    assert _cli("--create") == 0
    path = home / ".config" / "pycollective" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    assert len(token) == 64 and token not in capsys.readouterr().out  # never printed
    assert read_token_file({"HOME": str(home)}) == (token, str(path))
    # A second --create would cut running jobs off: it takes --replace.
    assert _cli("--create") == 1 and "--replace" in capsys.readouterr().err
    assert _cli("--create", "--replace") == 0
    assert path.read_text().strip() != token
    assert _cli() == 0 and "readable by its owner alone" in capsys.readouterr().out


def test_token_file_readable_by_others_is_refused(home):
    path = home / "token"
    path.write_text("secret\n")
    os.chmod(path, 0o644)
    env = {"PYCOLLECTIVE_TOKEN_FILE": str(path)}
    with pytest.raises(ValueError) as info:
        read_token_file(env)
    message = str(info.value)
    assert "mode 0644" in message and f"chmod 600 {path}" in message
    # And so is every launch that would use it: the group does not start.
    with pytest.raises(ValueError, match="mode 0644"):
        ClusterSpec.from_env({**SLURM_TWO_NODES, **env})
    os.chmod(path, 0o600)
    assert read_token_file(env) == ("secret", str(path))


def test_token_file_problems_say_what_to_do(home):
    assert read_token_file({"HOME": str(home)}) is None  # no file: not an error
    missing = {"PYCOLLECTIVE_TOKEN_FILE": str(home / "nope")}
    with pytest.raises(ValueError, match="does not exist: create it"):
        read_token_file(missing)
    empty = home / "empty"
    empty.write_text("")
    os.chmod(empty, 0o600)
    with pytest.raises(ValueError, match="is empty"):
        read_token_file({"PYCOLLECTIVE_TOKEN_FILE": str(empty)})


# -- which path a launch takes ------------------------------------------------------------


def test_slurm_on_one_node_publishes_through_a_private_file():
    s = ClusterSpec.from_env(SLURM_ONE_NODE)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (1, 4, 1, 4)
    assert (s.master_addr, s.master_port, s.token) == ("127.0.0.1", 0, None)
    assert s.job_key == "slurm-42.3"
    assert "every rank on this host" in s.source


def test_a_batch_script_itself_is_no_srun_step():
    # `python train.py` straight in a batch script: Slurm sets no step id there, so no private
    # file is awaited; the group wants a token like any multi-node one.
    batch = {k: v for k, v in SLURM_ONE_NODE.items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(ValueError, match="no cluster token"):
        ClusterSpec.from_env({**batch, "SLURM_PROCID": "0", "SLURM_NNODES": "1"})


def test_open_mpi_on_one_host_publishes_through_a_private_file():
    s = ClusterSpec.from_env(OMPI_ONE_HOST)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (2, 3, 2, 3)
    assert s.job_key == "ompi-2001862657"
    # Open MPI 4 without PMIx's namespace: ORTE's job id.
    env = {k: v for k, v in OMPI_ONE_HOST.items() if k != "PMIX_NAMESPACE"}
    assert ClusterSpec.from_env({**env, "OMPI_MCA_ess_base_jobid": "77"}).job_key == "ompi-77"


@pytest.mark.parametrize(
    "named",
    [
        {"PYCOLLECTIVE_MASTER_ADDR": "127.0.0.1", "PYCOLLECTIVE_MASTER_PORT": "29400"},
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    ],
)
def test_a_named_coordinator_wins_over_the_job_file(named):
    s = ClusterSpec.from_env({**OMPI_ONE_HOST, **named, "PYCOLLECTIVE_TOKEN": "t"})
    assert s.job_key is None and s.master_addr == "127.0.0.1" and s.master_port > 0


def test_slurm_across_nodes_takes_the_token_file(home):
    with pytest.raises(ValueError) as info:
        ClusterSpec.from_env({**SLURM_TWO_NODES, "HOME": str(home)})
    assert "no cluster token" in str(info.value)
    assert "pycollective token --create" in str(info.value)
    assert _write_token(home) == "from-file"
    s = ClusterSpec.from_env({**SLURM_TWO_NODES, "HOME": str(home)})
    assert (s.master_addr, s.master_port) == ("node07", 20000 + 42 * 10 + 3)
    assert s.token == "from-file" and s.job_key is None
    assert "token from" in s.source
    # PYCOLLECTIVE_TOKEN beats the file.
    s = ClusterSpec.from_env({**SLURM_TWO_NODES, "HOME": str(home), "PYCOLLECTIVE_TOKEN": "env"})
    assert s.token == "env"


def test_open_mpi_across_hosts_says_how_to_name_the_coordinator():
    env = {**OMPI_ONE_HOST, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    with pytest.raises(ValueError, match="pass them with -x"):
        ClusterSpec.from_env({**env, "PYCOLLECTIVE_TOKEN": "t"})


def _write_token(home) -> str:
    folder = home / ".config" / "pycollective"
    folder.mkdir(parents=True)
    path = folder / "token"
    path.write_text("from-file\n")
    os.chmod(path, 0o600)
    return read_token_file({"HOME": str(home)})[0]


# -- the job file ---------------------------------------------------------------------


def test_rank_0_publishes_and_the_others_read(private_tmp):
    zero = SameHostJob.join(ClusterSpec.from_env({**SLURM_ONE_NODE, "SLURM_PROCID": "0"}), 1)
    assert zero.spec.token and zero.spec.announced and zero.spec.master_port == 0
    zero.publish("127.0.0.1:34567")
    info = os.stat(zero.path)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(zero.path)).st_mode) == 0o700
    one = SameHostJob.join(ClusterSpec.from_env(SLURM_ONE_NODE), 5)
    assert one.spec.master == "127.0.0.1:34567" and one.spec.token == zero.spec.token
    one.finish()  # only rank 0 removes it
    assert os.path.exists(zero.path)
    zero.finish()
    assert not os.path.exists(zero.path)


def test_rank_0_keeps_a_configured_token(private_tmp):
    spec = ClusterSpec.from_env({**SLURM_ONE_NODE, "SLURM_PROCID": "0", "PYCOLLECTIVE_TOKEN": "t"})
    assert SameHostJob.join(spec, 1).spec.token == "t"


def test_waiting_rank_gives_up_with_a_clear_error(private_tmp):
    with pytest.raises(RendezvousError) as info:
        SameHostJob.join(ClusterSpec.from_env(SLURM_ONE_NODE), 0.2)
    message = str(info.value)
    assert "rank 1 of 4" in message and "did not publish" in message
    assert "job-slurm-42.3.json" in message and "PYCOLLECTIVE_CONNECT_TIMEOUT" in message


def test_a_file_left_by_a_dead_rank_0_is_ignored(private_tmp):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = job_file.job_file_path("slurm-42.3")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        json.dump({"address": "127.0.0.1:1", "token": "stale", "pid": dead.pid}, f)
    with pytest.raises(RendezvousError, match="did not publish"):
        SameHostJob.join(ClusterSpec.from_env(SLURM_ONE_NODE), 0.2)


def test_a_folder_others_can_enter_is_refused(private_tmp):
    folder = private_tmp / f"pycollective-{os.getuid()}"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    with pytest.raises(RendezvousError, match="mode 0755"):
        job_file.job_folder()
