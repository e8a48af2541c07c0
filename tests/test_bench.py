"""The benchmark runs end to end on tiny sizes and emits a well-formed table, JSON, CSV and PNG;
a corrupted result is reported as wrong and fails the command. No timing asserts."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from multiproc import processes_naming

BENCH = [sys.executable, "-m", "pycollective.cli", "bench"]
TINY = ["-b", "1K", "-e", "4K", "-n", "3", "-w", "1", "--budget", "0.05"]


def run(
    args: list[str], timeout: float = 150, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(BENCH + args, capture_output=True, text=True, timeout=timeout, env=env)


def scratch_environment(folder) -> dict[str, str]:
    """This environment with its temporary files in `folder`, to see what a run leaves."""
    return dict(os.environ, TMPDIR=str(folder))


def left_behind(folder) -> list[str]:
    """Our temporary files and folders still in `folder` (the peers' caches are theirs)."""
    return [p.name for p in folder.iterdir() if p.name.startswith("pycol-")]


@pytest.mark.timeout(180)
def test_inproc_outputs(tmp_path):
    j, c, p = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    res = run(
        [
            "--mode",
            "inproc",
            "--world",
            "3",
            *TINY,
            "--json",
            str(j),
            "--csv",
            str(c),
            "--plot",
            str(p),
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "busbw(GB/s)" in line)
    assert set(lines[header + 1].replace(" ", "")) == {"-"}
    assert "all results correct" in res.stdout and "best" in res.stdout
    data = json.loads(j.read_text())
    algos = {r["algo"] for r in data["rows"]}
    assert {"ring", "halving_doubling", "reduce_to_one", "direct", "auto", "numpy"} <= algos
    assert data["ceilings"]["memory_copy_Bps"] > 0
    # The in-process model's cache line, said in the header and kept in the JSON.
    line = data["ceilings"]["cache_resident_bytes"]
    assert line >= 1 << 20 and "count as in cache" in res.stdout
    looks = [r["extra"]["second_look"] for r in data["rows"] if r["algo"] == "auto"]
    assert looks and all(look["best"] in algos - {"auto", "numpy"} for look in looks)
    assert all(r["wrong"] == 0 and r["median_s"] > 0 for r in data["rows"])
    with open(c) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["rows"]) and float(rows[0]["busbw_Bps"]) > 0
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(240)
def test_processes_over_both_transports_with_peers(tmp_path):
    res = run(
        ["--world", "2", *TINY, "--transports", "shm,tcp", "--peers", "gloo,mpi,tensorflow"],
        env=scratch_environment(tmp_path),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # Each job's folder (its job and rows files) goes with the job: runs left them in /tmp.
    assert left_behind(tmp_path) == []
    for transport in ("shm", "tcp"):
        assert f"allreduce over {transport}:" in res.stdout
    # Every peer either ran (a row) or was skipped with a one-line reason.
    for peer in ("gloo", "mpi", "tensorflow"):
        assert f"{peer} (peer)" in res.stdout or f"peer {peer} skipped:" in res.stdout, peer


@pytest.mark.timeout(120)
def test_ctrl_c_stops_the_ranks_too(tmp_path):
    """The ranks run in process groups of their own, out of reach of the terminal's Ctrl-C: bench
    kills them on its way out (they ran on, orphaned, before)."""
    proc = subprocess.Popen(
        BENCH + ["--world", "2", "-b", "64M", "-e", "64M", "--peers", "", "--budget", "30"],
        env=scratch_environment(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's foreground group, which Ctrl-C signals whole
    )
    deadline = time.monotonic() + 60
    while len(processes_naming(str(tmp_path))) < 2:  # the ranks' command names their job file
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    # Into the 64 MiB row's 30 s of timing: a rank stopped while it starts up, or one printing
    # its progress, dies of the closed pipe anyway; one between prints ran on.
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    time.sleep(0.5)
    assert processes_naming(str(tmp_path)) == []
    assert left_behind(tmp_path) == []


@pytest.mark.timeout(240)
def test_rounds_alternate_ours_and_the_peers(tmp_path):
    """--rounds 2: ours and a peer run twice each, alternating; each row is one row of the
    rounds (no duplicates), checked like the others."""
    j = tmp_path / "r.json"
    res = run(
        ["--world", "2", *TINY, "--algos", "ring,auto", "--peers", "mpi", "--rounds", "2"]
        + ["--json", str(j)]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(j.read_text())["rows"]
    keys = [(r["algo"], r["nbytes"]) for r in rows]
    assert len(keys) == len(set(keys))
    ours = {k for k in keys if k[0] in ("ring", "auto")}
    assert ours == {(a, n) for a in ("ring", "auto") for n in (1024, 4096)}
    assert all(r["wrong"] == 0 and 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"] for r in rows)
    assert "mpi (peer)" in res.stdout or "peer mpi skipped:" in res.stdout


@pytest.mark.timeout(240)
def test_mpi_timed_in_our_ranks(tmp_path):
    """--mpi-in-job: mpirun starts our shm ranks, which time Open MPI's Allreduce beside ours
    (checked against numpy like ours) instead of a launch of its own; tcp rows still run."""
    j = tmp_path / "r.json"
    res = run(
        ["--world", "2", *TINY, "--algos", "auto,prepared", "--peers", "mpi", "--mpi-in-job"]
        + ["--transports", "shm,tcp", "--json", str(j)]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    if "peer mpi skipped:" in res.stdout:
        pytest.skip(res.stdout.split("peer mpi skipped:")[1].splitlines()[0])
    assert "mpi timed in our shm ranks" in res.stdout
    rows = json.loads(j.read_text())["rows"]
    mpi = [r for r in rows if r["algo"] == "mpi"]
    assert sorted(r["nbytes"] for r in mpi) == [1024, 4096] and all(r["peer"] for r in mpi)
    ours = {(r["algo"], r["transport"]) for r in rows if not r["peer"]}
    assert ours == {(a, t) for a in ("auto", "prepared") for t in ("shm", "tcp")}
    assert all(r["wrong"] == 0 and r["median_s"] > 0 for r in rows)
    assert "vs mpi (shm) at 1 KiB" in res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_new_outputs_and_the_prepared_row(mode):
    """--new-outputs: every call returns new result arrays (checked like the others); in procs
    mode the 'prepared' row (pycollective.prepare_allreduce) runs beside auto."""
    args = ["--mode", mode, "--world", "2", "-b", "4K", "-e", "2M", "-f", "512", "-n", "3"]
    if mode == "procs":
        args += ["--peers", "", "--algos", "auto,prepared,shared"]
    else:
        args += ["--algos", "auto,direct"]
    res = run(args + ["--new-outputs"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all results correct" in res.stdout
    if mode == "procs":
        assert " prepared " in res.stdout and " shared " in res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_the_new_outputs_row_sits_beside_auto(mode, tmp_path):
    """--new-outputs-row: auto's call into new result arrays (a group of its own) is checked and
    timed in the same rounds as the out= rows, and the summary gives its ratio to auto's row
    (added where --algos leaves it out); it is never taken for the best algorithm."""
    j = tmp_path / "r.json"
    args = ["--mode", mode, "--world", "2", "-b", "4K", "-e", "1M", "-f", "256", "-n", "3"]
    if mode == "procs":
        args += ["--peers", ""]
    res = run(args + ["--algos", "ring", "--new-outputs-row", "--json", str(j)])
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(j.read_text())["rows"]
    assert sorted(r["algo"] for r in rows if r["nbytes"] == 4096 and not r["peer"]) == [
        "auto",
        "auto+new",
        "ring",
    ], rows
    new = [r for r in rows if r["algo"] == "auto+new"]
    assert sorted(r["nbytes"] for r in new) == [4096, 1 << 20], rows
    assert all(r["wrong"] == 0 and r["median_s"] > 0 and r["extra"]["chose"] for r in new)
    assert res.stdout.count("auto's out= calls") == 2, res.stdout
    assert "best auto+new" not in res.stdout, res.stdout
    refused = run(args + ["--new-outputs-row", "--new-outputs"])
    assert refused.returncode != 0 and "drop --new-outputs" in refused.stderr


@pytest.mark.timeout(120)
def test_the_shared_row_runs_on_mapped_arrays(tmp_path):
    """The 'shared' row: prepare_allreduce on pycollective.shared_empty arrays, which the ranks
    map from each other (direct) from 16 KiB up; the summary sets auto beside the best row on
    private buffers, and names the shared arrays' time apart."""
    j = tmp_path / "r.json"
    res = run(
        ["--world", "2", "-b", "4K", "-e", "1M", "-f", "256", "-n", "3", "--peers", ""]
        + ["--algos", "auto,prepared,shared", "--json", str(j)]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    chose = {
        r["nbytes"]: r["extra"]["chose"]
        for r in json.loads(j.read_text())["rows"]
        if r["algo"] == "shared"
    }
    assert chose[1 << 20] == "direct (shared arrays)" and "shared" not in chose[4096], chose
    assert "all results correct" in res.stdout
    # auto is timed again against the fastest row on the caller's own buffers, never 'shared'
    looks = [
        r["extra"]["second_look"] for r in json.loads(j.read_text())["rows"] if r["algo"] == "auto"
    ]
    assert len(looks) == 2 and {look["best"] for look in looks} <= {"prepared"}
    assert "again head to head with prepared" in res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_other_collectives(collective):
    res = run(["--mode", "inproc", "--world", "2", "-c", collective, *TINY])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all results correct" in res.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_peers_run_reduce_scatter_and_allgather(collective):
    """Open MPI and gloo time the same reduce-scatters and allgathers, their results checked
    against numpy as ours (three ranks: shares of unequal length, which gloo refuses)."""
    for world in ("2", "3"):
        res = run(
            [
                "--world",
                world,
                "-c",
                collective,
                *TINY,
                "--transports",
                "shm",
                "--algos",
                "staged,auto",
                "--peers",
                "gloo,mpi",
            ]
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "all results correct" in res.stdout
        for peer in ("gloo", "mpi"):
            if f"peer {peer} skipped:" in res.stdout:
                continue
            unequal = world == "3" and collective == "reduce_scatter" and peer == "gloo"
            assert (f"{peer} (peer)" in res.stdout) != unequal, res.stdout
            # A row that could not run says why above the table.
            assert (f"# skip {peer} from" in res.stdout) == unequal, res.stdout


@pytest.mark.timeout(180)
def test_gloo_peer_runs_bfloat16():
    """numpy's bfloat16 (ml_dtypes) reaches gloo through an int16 view: torch.from_numpy refuses
    it, and the peer's row was missing with a note that said nothing of why."""
    pytest.importorskip("ml_dtypes")
    args = ["--world", "2", "-d", "bfloat16", *TINY, "--transports", "shm", "--algos", "auto"]
    res = run([*args, "--peers", "gloo"])
    assert res.returncode == 0, res.stdout + res.stderr
    if "peer gloo skipped:" not in res.stdout:
        assert "gloo (peer)" in res.stdout and "peer gloo failed" not in res.stdout, res.stdout


@pytest.mark.timeout(240)
def test_pretend_hosts_over_each_peers_own_transport():
    """--hosts with --transports auto: shm inside each pretend host (its host segment), tcp
    between them, where hierarchical runs; a forced shm transport cannot span the hosts."""
    res = run(
        [
            "--world",
            "4",
            "--hosts",
            "2",
            *TINY,
            "--transports",
            "auto",
            "--algos",
            "ring,hierarchical,auto",
            "--peers",
            "",
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "allreduce over auto:" in res.stdout and "all results correct" in res.stdout
    assert " hierarchical " in res.stdout


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
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective.cli",
            "tune",
            "--output",
            str(path),
            "--world",
            "2",
            "--replicas",
            "2",
            "--transports",
            "shm",
            "-b",
            "4K",
            "-e",
            "16K",
            "--budget",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
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
    try:
        with pytest.raises(ValueError, match="cannot read the tuning file"):
            pc.LocalCommunicator(2)
    finally:  # the configuration read the variable: read it again without, for later tests
        monkeypatch.undo()
        pc.config.reload()


def test_interleaved_timing_shares_rounds_and_takes_the_slowest_rank():
    from pycollective.bench.timing import time_interleaved

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    barriers = []
    samples = time_interleaved(
        calls,
        iters=8,
        warmup=1,
        budget_s=10.0,
        rounds=4,
        before_each=lambda: barriers.append(1),
        max_over_ranks=lambda x: np.asarray(x) + 1.0,
    )  # "slower rank"
    assert order[:2] == ["a", "b"]  # warm-up
    timed = order[4:]  # after warm-up and one probe each: 4 rounds of 2 a's then 2 b's
    assert timed == (["a", "a", "b", "b"] * 4)
    assert len(barriers) == 2 + len(timed)  # one before every timed call and probe
    assert {len(s) for s in samples.values()} == {8}
    assert all(t >= 1.0 for s in samples.values() for t in s)  # max_over_ranks was applied


def test_interleaved_timing_settles_each_row_untimed_before_its_timed_calls():
    from pycollective.bench.timing import settling_calls, time_interleaved

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    barriers = []
    samples = time_interleaved(
        calls, iters=16, warmup=0, budget_s=10.0, rounds=2, before_each=lambda: barriers.append(1)
    )
    per_round, settle = 8, settling_calls(8)
    assert settle == 2
    # after one probe each: per round, a's settling and timed calls, then b's
    assert order[2:] == (["a"] * (settle + per_round) + ["b"] * (settle + per_round)) * 2
    assert {len(s) for s in samples.values()} == {2 * per_round}  # settling calls not kept
    assert len(barriers) == len(order)  # the settling calls wait at the barrier like the rest
    assert settling_calls(3) == 0  # long calls, few a round: none


def test_interleaved_timing_never_exceeds_iters():
    from pycollective.bench.timing import time_interleaved

    for iters in (3, 100):
        samples = time_interleaved({"a": lambda: None}, iters=iters, warmup=0, budget_s=10.0)
        assert 1 <= len(samples["a"]) <= iters


def test_interleaved_timing_respects_the_budget():
    import time

    from pycollective.bench.timing import time_interleaved

    samples = time_interleaved(
        {"slow": lambda: time.sleep(0.01)}, iters=1000, warmup=0, budget_s=0.1, rounds=4
    )
    assert 4 <= len(samples["slow"]) <= 8  # one iteration per round, the budget allows ~2


def test_second_look_times_auto_again_against_the_first_pass_best():
    from pycollective.bench.timing import second_look

    ran = []
    calls = {name: (lambda name=name: ran.append(name)) for name in ("auto", "a", "b", "peer")}
    first = {"auto": [3.0, 3.0], "a": [2.0, 2.5], "b": [1.0, 9.0, 1.5], "peer": [0.1]}
    barriers = {name: (lambda name=name: ran.append("before " + name)) for name in calls}
    look = second_look(
        calls,
        first,
        "auto",
        {"peer"},  # faster, but not a candidate
        iters=4,
        budget_s=10.0,
        before_each=barriers,
        max_over_ranks=lambda x: np.asarray(x) + 1.0,  # "slower rank"
    )
    assert look.best == "b"  # median 1.5 beats a's 2.25
    assert set(ran) == {"auto", "b", "before auto", "before b"}  # only the pair, own barriers
    assert look.contender_s >= 1.0 and look.best_s >= 1.0  # the slowest rank's samples
    assert look.as_dict()["best"] == "b"
    assert second_look(calls, {"a": [1.0]}, "auto", set(), 4, 1.0) is None
    assert second_look(calls, {"auto": [1.0], "peer": [1.0]}, "auto", {"peer"}, 4, 1.0) is None


def test_summary_gives_the_second_look():
    from pycollective.bench import report
    from pycollective.bench.rows import Row

    look = {"best": "ring", "median_s": 1.2e-5, "best_median_s": 1.0e-5}
    rows = [
        Row("allreduce", 4096, 1024, "float32", "ring", "shm", 2, 1e-5, 1e-5, 1e-5),
        Row(
            "allreduce",
            4096,
            1024,
            "float32",
            "auto",
            "shm",
            2,
            2e-5,
            2e-5,
            2e-5,
            extra={"chose": "ring", "second_look": look},
        ),
    ]
    assert any(
        "auto 2.00x of best" in line and "again head to head with ring: auto 1.20x" in line
        for line in report.summary(rows)
    )


def test_summary_says_which_algorithm_auto_ran():
    from pycollective.bench import report
    from pycollective.bench.rows import Row

    def row(algo, t, **extra):
        return Row("allreduce", 4096, 1024, "float32", algo, "shm", 2, t, t, t, extra=extra)

    same = report.summary(
        [row("ring", 1e-5), row("halving_doubling", 2e-5), row("auto", 1.1e-5, chose="ring")]
    )
    assert any("auto 1.10x of best (it runs ring: the same code" in line for line in same)
    # Where in-process auto measures, its samples include calls of its rivals: no "noise" claim.
    watching = report.summary(
        [
            row("ring", 1e-5),
            row("halving_doubling", 2e-5),
            row("auto", 1.1e-5, chose="ring", measures="racing"),
        ]
    )
    assert any(
        "(it runs ring, and now and then one of its near rivals" in line for line in watching
    )
    assert not any("timing noise" in line for line in watching)
    # A lone choice whose calls are timed in case it slows: said so, not "a table lookup".
    watched = report.summary(
        [
            row("ring", 1e-5),
            row("halving_doubling", 2e-5),
            row("auto", 1e-5, chose="ring", measures="watched"),
        ]
    )
    assert any("(it runs ring and times its calls, racing the others" in line for line in watched)
    assert not any("table lookup" in line for line in watched)
    other = report.summary(
        [
            row("ring", 1e-5),
            row("halving_doubling", 2e-5),
            row("auto", 2.1e-5, chose="halving_doubling"),
        ]
    )
    assert any(
        "auto 2.10x of best (it runs halving_doubling, 2.00x of best)" in line for line in other
    )


def test_how_auto_measures_reads_the_explain_words():
    from pycollective.bench.worker import RACING, WATCHED, how_auto_measures

    # The words of LocalCommunicator/ProcessGroup.explain (tests/test_auto_trial.py asserts them).
    assert how_auto_measures("ring (measured, the median of ...)") == RACING
    assert (
        how_auto_measures(
            "direct (model 701us; no other algorithm priced near it: its calls are timed, and the "
            "other algorithms raced should they run 2x slower than usual)"
        )
        == WATCHED
    )
    assert (
        how_auto_measures("ring (model 3us; no other algorithm priced near it, nothing to measure)")
        == ""
    )


def test_torch_bench_runs_and_checks(tmp_path):
    """bench/torch_bench.py: both backends in one set of processes, results checked, the goal
    lines printed (timings are not asserted)."""
    pytest.importorskip("torch", reason="the torch backend benchmark needs torch")
    out = tmp_path / "torch.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective.bench.torch_bench",
            "--worlds",
            "2",
            "-b",
            "4K",
            "-e",
            "64K",
            "-f",
            "16",
            "-n",
            "8",
            "--budget",
            "0.05",
            "--ddp-steps",
            "2",
            "--batch",
            "4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=scratch_environment(scratch),
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert left_behind(scratch) == []  # the ranks' job folder goes with them
    summary = json.loads(out.read_text())["summary"]
    # all_reduce's two goals and DDP's; reduce_scatter_tensor and all_gather_into_tensor against
    # gloo at the smallest and largest size.
    assert len(summary) == 7, summary
    assert sum("goal" in line for line in summary) == 3, summary
    for name in ("reduce_scatter_tensor 4 KiB", "all_gather_into_tensor 64 KiB"):
        assert any(name in line and "gloo's speed" in line for line in summary), summary
    results = json.loads(out.read_text())["results"]["2"]
    for collective in ("allreduce", "reduce_scatter", "allgather"):
        rows = results[collective]
        assert {r["backend"] for r in rows} == {"pycollective", "gloo"}, collective
        assert all(r["wrong"] == 0 for r in rows), rows  # against numpy, in the ranks


def test_summary_puts_tcp_against_one_loopback_stream_and_gloo():
    from pycollective.bench import report
    from pycollective.bench.rows import Row

    mib64 = 64 << 20

    def row(algo, transport, t, peer=False):
        return Row(
            "allreduce", mib64, mib64 // 4, "float32", algo, transport, 2, t, t, t, peer=peer
        )

    rows = [
        row("ring", "tcp", 0.030),
        row("auto", "tcp", 0.0268435456),  # 2.5 GB/s busbw with 2 ranks
        row("gloo", "tcp", 0.0536870912, peer=True),
    ]
    ceilings = {"loopback_tcp_Bps": 5e9}
    lines = report.summary(rows, ceilings)
    want = "tcp allreduce at 64 MiB: auto 2.50 GB/s = 0.50x one loopback TCP stream; 2.00x gloo"
    assert want in lines, lines
    assert not any(line.startswith("tcp ") for line in report.summary(rows))  # no ceiling
    ceilings["loopback_tcp_exchange_Bps"] = 3.125e9
    want = (
        "tcp allreduce at 64 MiB: auto 2.50 GB/s = 0.50x one loopback TCP stream, "
        "0.80x the two-way exchange; 2.00x gloo"
    )
    assert want in report.summary(rows, ceilings)
    # One stream from and into buffers of the row's size: named at that size only.
    ceilings.update(loopback_tcp_span_Bps=2e9, loopback_tcp_span_bytes=64 << 20)
    want = want.replace("exchange;", "exchange, 1.25x one stream from and into 64 MiB buffers;")
    assert want in report.summary(rows, ceilings)
    ceilings["loopback_tcp_span_bytes"] = 256 << 20
    assert not any("buffers" in line for line in report.summary(rows, ceilings))


def test_per_round_measures_are_taken_every_round_and_reported_as_their_median(monkeypatch):
    """The TCP ceilings (and the CPUs' distance) are measured before each round's launches, so
    that they drift with the rows they bound, and the header gives the median of the rounds and
    their range."""
    from pycollective.bench import cli, procs

    order: list[str] = []
    monkeypatch.setattr(procs, "_spawn_ranks", lambda job, *a: order.append(job["backend"]) or [])
    job = ("allreduce", [1024], "float32", "sum", 2, ["ring"], ["tcp"], [], 3, 1, 0.05)
    procs.run(*job, lambda _: None, [], rounds=3, before_round=lambda: order.append("ceilings"))
    assert order == ["ceilings", "pycollective"] * 3
    lines = cli.per_round_lines(
        {
            "cache_line_round_trip_ns": [52.4, 340.0, 55.0],
            "loopback_tcp_Bps": [3e9, 4.5e9, 4e9],
            "loopback_tcp_exchange_Bps": [2.5e9],
            "loopback_tcp_span_Bps": [1.8e9, 1.9e9],
        },
        (0, 1),
        64 << 20,
    )
    assert lines == [
        "# machine: a cache line from CPU 0 to CPU 1 and back: 55 ns (median of 3 rounds, 52-340)",
        "# ceiling: loopback TCP, one stream: 4.00 GB/s (median of 3 rounds, 3.00-4.50)",
        "# ceiling: loopback TCP, two endpoints sending and receiving at once: 2.50 GB/s each way",
        "# ceiling: loopback TCP, one stream from and into 64 MiB buffers: 1.85 GB/s "
        "(median of 2 rounds, 1.80-1.90)",
    ]


def test_cache_line_round_trip_between_two_cpus():
    """The probe of how far apart two CPUs are answers in nanoseconds, and -1 for a CPU this
    process cannot use or for one CPU twice."""
    import pycollective as pc
    from pycollective.bench import ceilings

    pair = ceilings.two_cpus()
    if pair is None:
        pytest.skip("one CPU: no pair to measure")
    ns = ceilings.cache_line_round_trip_ns(*pair)
    assert ns is not None and 1 < ns < 1e6, ns
    assert pc._C.cache_line_round_trip_ns(pair[0], 4095) == -1
    assert pc._C.cache_line_round_trip_ns(pair[0], pair[0]) == -1


@pytest.mark.timeout(60)
def test_exchange_ceiling_moves_bytes_both_ways():
    """The two-way exchange ceiling completes (both endpoints sent and received everything) and
    reports a rate."""
    from pycollective.bench import ceilings

    rate = ceilings.loopback_tcp_exchange_bandwidth(nbytes=8 << 20, chunk=1 << 20)
    assert rate > 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rule", [["--momentum", "0.9"], ["--adam"]])
def test_strategy_bench_across_workers_prints_both_ratios(rule):
    """bench/strategy_bench.py with 2 workers: the bare all-reduce, both steps and the update
    alone are timed (after a barrier each, the slowest rank's) and the line names them all."""
    res = subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", "-n", "2", "--timeout", "150"]
        + [sys.executable, "-m", "pycollective.bench.strategy_bench", "--multi-worker"]
        + ["--sharded", "--mib", "1", "--variables", "2", "--iters", "3", *rule],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = [ln for ln in res.stdout.splitlines() if "bare allreduce" in ln]
    assert len(line) == 1, res.stdout[-2000:]
    for part in ("unsharded step", "sharded step", "(0.500 of unsharded)", "alone"):
        assert part in line[0], line[0]


def test_tune_fits_link_costs_without_the_models_crowding():
    """bench/tune.fit_costs on ring timings made by the model's own formula: the costs come back,
    and with 4 processes on 2 cores the crowding the model adds (a wait per step, bytes at half
    speed) is taken out rather than fitted into alpha and beta."""
    from pycollective import cost_model
    from pycollective.bench.rows import Row
    from pycollective.bench.tune import fit_costs

    local = (3e-6, 1 / 8e9, 1 / 10e9)

    def ring_rows(world, cores, sizes=(8, 16 << 20)):
        rows = []
        for nbytes in sizes:
            est = cost_model.estimate([0] * world, nbytes, local=local, remote=local, cores=cores)
            t = est.seconds["ring"]
            rows.append(
                Row("allreduce", nbytes, nbytes // 4, "float32", "ring", "shm", world, t, t, t)
            )
        return rows

    own = fit_costs(ring_rows(4, 0), 4, local[2], cores=0)
    crowded = fit_costs(ring_rows(4, 2), 4, local[2], cores=2)
    assert own is not None and crowded is not None
    assert crowded[0] == pytest.approx(own[0], rel=0.05)  # alpha: the parked wait taken out
    assert crowded[1] == pytest.approx(own[1], rel=0.05)  # beta: the shared cores taken out
    naive = fit_costs(ring_rows(4, 2), 4, local[2], cores=0)  # what tune fitted before
    assert naive[0] > 2 * own[0] and naive[1] > 1.5 * own[1]
    # Three rounds, the first slowed 3.3x at the smallest size (as one tune's was): the median
    # of the rounds is fitted, not the first round's row.
    rounds = ring_rows(4, 0) + ring_rows(4, 0) + ring_rows(4, 0)
    first_small = next(r for r in rounds if r.nbytes == 8)
    first_small.median_s *= 3.3
    assert fit_costs(rounds, 4, local[2], cores=0)[0] == pytest.approx(own[0], rel=0.01)
    # Every round's first row (the smallest size) slowed 4x, as a start can in every round: the
    # next sizes give alpha.
    sizes = (8, 16, 32, 16 << 20)
    slowed = [r for _ in range(3) for r in ring_rows(4, 0, sizes)]
    for r in slowed:
        if r.nbytes == 8:
            r.median_s *= 4
    assert fit_costs(slowed, 4, local[2], cores=0)[0] == pytest.approx(own[0], rel=0.01)


def test_tune_keeps_a_lone_winner_only_where_it_won_by_the_margin():
    """bench/tune.winners: the winner of each size by its slowest round, a near tie going to the
    previous size's winner; a winner at one size alone between two sizes won by another
    algorithm gives way to it where that ran within 1.15x, and keeps the entry beyond."""
    from pycollective.bench.rows import Row
    from pycollective.bench.tune import winners

    def rows(times_us: dict[int, dict[str, list[float]]]) -> list[Row]:
        return [
            Row("allreduce", n, n // 4, "float32", algo, "shm", 4, t * 1e-6, t * 1e-6, t * 1e-6)
            for n, by_algo in times_us.items()
            for algo, rounds in by_algo.items()
            for t in rounds
        ]

    def picks(times_us):
        return [c["algo"] for c in winners(rows(times_us), "shm", 4, "allreduce")]

    def sweep(middle: dict[str, list[float]]):
        return {
            1 << 20: {"staged": [100, 101, 102], "hierarchical": [130, 131, 132]},
            2 << 20: middle,
            4 << 20: {"staged": [400, 401, 402], "hierarchical": [520, 521, 522]},
        }

    # Its slowest round decides: hierarchical's 290 against staged's 330 (1.14x) at 2 MiB.
    assert (
        picks(sweep({"staged": [200, 210, 330], "hierarchical": [280, 285, 290]})) == ["staged"] * 3
    )
    # 1.2x: the lone winner keeps its entry.
    assert picks(sweep({"staged": [200, 210, 348], "hierarchical": [280, 285, 290]})) == [
        "staged",
        "hierarchical",
        "staged",
    ]
    # Ends are not lone winners, and two sizes in a row are a run, not noise.
    two = sweep({"staged": [300], "hierarchical": [200]})
    two[4 << 20] = {"staged": [600], "hierarchical": [400]}
    two[8 << 20] = {"staged": [800], "hierarchical": [900]}
    assert picks(two) == ["staged", "hierarchical", "hierarchical", "staged"]


def test_tune_measures_two_to_four_processes_the_cores_first():
    from pycollective.bench import tune

    assert tune.process_worlds(None, 2) == [2, 3, 4]
    assert tune.process_worlds(None, 16) == [4, 2, 3]
    assert tune.process_worlds(None, 3) == [3, 2, 4]
    assert tune.process_worlds("2", 16) == [2]
    assert tune.process_worlds("4,2,4", 2) == [4, 2]
    for bad in ("1", "x", "2,0"):
        with pytest.raises(SystemExit, match="--world takes"):
            tune.process_worlds(bad, 2)
