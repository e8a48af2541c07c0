"""The benchmark runs end to end on tiny sizes and emits a well-formed table, JSON, CSV and PNG;
a corrupted result is reported as wrong and fails the command. No timing asserts."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

BENCH = [sys.executable, "-m", "pycollective.cli", "bench"]
TINY = ["-b", "1K", "-e", "4K", "-n", "3", "-w", "1", "--budget", "0.05"]


def run(args: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(BENCH + args, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(180)
def test_inproc_outputs(tmp_path):
    j, c, p = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    res = run(["--mode", "inproc", "--world", "3", *TINY, "--json", str(j), "--csv", str(c),
               "--plot", str(p)])
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "busbw(GB/s)" in line)
    assert set(lines[header + 1].replace(" ", "")) == {"-"}
    assert "all results correct" in res.stdout and "best" in res.stdout
    data = json.loads(j.read_text())
    algos = {r["algo"] for r in data["rows"]}
    assert {"ring", "halving_doubling", "reduce_to_one", "direct", "auto", "numpy"} <= algos
    assert data["ceilings"]["memory_copy_Bps"] > 0
    assert all(r["wrong"] == 0 and r["median_s"] > 0 for r in data["rows"])
    with open(c) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["rows"]) and float(rows[0]["busbw_Bps"]) > 0
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(240)
def test_processes_over_both_transports_with_peers():
    res = run(["--world", "2", *TINY, "--transports", "shm,tcp", "--peers", "gloo,mpi,tensorflow"])
    assert res.returncode == 0, res.stdout + res.stderr
    for transport in ("shm", "tcp"):
        assert f"allreduce over {transport}:" in res.stdout
    # Every peer either ran (a row) or was skipped with a one-line reason.
    for peer in ("gloo", "mpi", "tensorflow"):
        assert f"{peer} (peer)" in res.stdout or f"peer {peer} skipped:" in res.stdout, peer


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_other_collectives(collective):
    res = run(["--mode", "inproc", "--world", "2", "-c", collective, *TINY])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all results correct" in res.stdout


@pytest.mark.timeout(120)
def test_corrupted_result_fails_the_command(monkeypatch, capsys):
    import pycollective
    from pycollective.bench import cli

    real = pycollective.LocalCommunicator.allreduce

    def corrupting(self, tensors, *args, **kwargs):
        outs = real(self, tensors, *args, **kwargs)
        np.asarray(outs[-1]).reshape(-1)[0] += 1  # one wrong element on one replica
        return outs

    monkeypatch.setattr(pycollective.LocalCommunicator, "allreduce", corrupting)
    code = cli.main(["--mode", "inproc", "--world", "2", "--algos", "ring", *TINY])
    out = capsys.readouterr().out
    assert code == 1
    assert "WRONG" in out and "WRONG RESULTS" in out


@pytest.mark.timeout(240)
def test_tune_writes_a_table_that_auto_follows(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    res = subprocess.run([sys.executable, "-m", "pycollective.cli", "tune", "--output", str(path),
                          "--world", "2", "--replicas", "2", "--transports", "shm",
                          "-b", "4K", "-e", "16K", "--budget", "0.05"],
                         capture_output=True, text=True, timeout=200)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(path.read_text())
    assert {c["transport"] for c in data["choices"]} == {"shm", "inproc"}
    assert set(data["costs"]) == {"shm", "inproc"}

    import pycollective as pc

    monkeypatch.setenv("PYCOLLECTIVE_TUNING", str(path))
    comm = pc.LocalCommunicator(2)
    assert "tuned table" in comm.explain("allreduce", 4096)
    xs = [np.ones(1024, np.float32)] * 2
    assert (comm.allreduce(xs)[0] == 2).all()


def test_malformed_tuning_file_is_an_error(tmp_path, monkeypatch):
    import pycollective as pc

    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    monkeypatch.setenv("PYCOLLECTIVE_TUNING", str(bad))
    with pytest.raises(ValueError, match="cannot read the tuning file"):
        pc.LocalCommunicator(2)
