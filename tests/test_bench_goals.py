"""``pycollective bench-goals`` reads bench's JSON into verdicts: which rows count as ours,
which as an algorithm auto could have chosen, and when a cell counts against auto. The pure
functions are fed rows made here; one small goal runs end to end through a real bench run."""

from __future__ import annotations

import json
import time

import pytest
from multiproc import processes_naming

from pycollective.bench import goals


def row(algo, nbytes, seconds, peer=False, transport="shm", world=2, **extra):
    return {
        "collective": "allreduce",
        "nbytes": nbytes,
        "algo": algo,
        "transport": transport,
        "world": world,
        "median_s": seconds,
        "peer": peer,
        "extra": extra,
        "busbw_Bps": nbytes / seconds,
    }


def test_peer_ratio_takes_our_fastest_row_on_the_callers_own_buffers():
    data = {
        "ceilings": {},
        "rows": [
            row("ring", 8, 9e-6),
            row("prepared", 8, 5e-6),
            row("shared", 8, 3e-6),  # the caller's arrays would have to be allocated so
            row("auto+new", 8, 1e-6),  # another kind of call
            row("mpi", 8, 6e-6, peer=True),
        ],
    }
    [(nbytes, ratio, algo)] = goals.peer_ratios(data, "mpi")
    assert (nbytes, algo) == (8, "prepared")
    assert ratio == pytest.approx(1.2)


def test_a_cell_counts_against_auto_only_when_both_looks_are_over_the_bound():
    look = {"best": "ring", "median_s": 1.0, "best_median_s": 1.0}
    data = {
        "ceilings": {},
        "rows": [
            # 64: slow in the pass, level head to head: noise, not a trap.
            row("ring", 64, 1e-6),
            row("auto", 64, 1.3e-6, chose="slots", second_look=look),
            # 128: slow in both looks.
            row("ring", 128, 1e-6),
            row("auto", 128, 1.3e-6, chose="slots", second_look=dict(look, median_s=1.2)),
            # 256: prepared and shared are not algorithms auto could have run.
            row("ring", 256, 1e-6),
            row("prepared", 256, 0.5e-6),
            row("shared", 256, 0.4e-6),
            row("auto", 256, 1.1e-6, chose="ring"),
        ],
    }
    cells = goals.auto_cells(data)
    assert [(n, round(first, 2)) for n, _, first, _, _ in cells] == [
        (64, 1.3),
        (128, 1.3),
        (256, 1.1),
    ]
    traps = goals.auto_traps(cells)
    assert len(traps) == 1 and traps[0].startswith("128 B shm: 1.30x, again 1.20x (ran slots)")


@pytest.mark.parametrize("auto_Bps, met", [(2.0e9, False), (2.8e9, True)])
def test_tcp_goal_sets_auto_against_the_stream_and_gloo(auto_Bps, met):
    size = 64 << 20
    data = {
        "ceilings": {"loopback_tcp_Bps": 4e9},
        "rows": [
            row("auto", size, size / auto_Bps, transport="tcp"),
            row("gloo", size, size / 1.0e9, peer=True, transport="tcp"),
        ],
    }
    share, gloo = goals.tcp_figures(data)
    assert share == pytest.approx(auto_Bps / 4e9) and gloo == pytest.approx(auto_Bps / 1e9)
    assert goals.judge(3, {"tcp_procs2": data}, {}).met is met


def test_the_strategy_step_ratio_is_the_last_one_printed():
    text = "warm-up ratio 2.00x\n16 MiB ...: bare allreduce 4.1 ms, step 3.6 ms, ratio 0.88x\n"
    assert goals.strategy_ratio(text) == 0.88
    assert goals.strategy_ratio("no figures") is None


def _goal5_run(*timing: str) -> goals.Run:
    """Goal 5's in-process run on 64 KiB buffers (its own takes 64 MiB), timed by `timing`."""
    return goals.Run(
        "new_inproc2",
        ["--mode", "inproc", "--world", "2", "-b", "64K", "-e", "64K", "--peers", ""]
        + ["--new-outputs-row", *timing],
    )


@pytest.mark.timeout(240)
def test_a_goal_runs_end_to_end(tmp_path, monkeypatch):
    # Goal 5 on one small in-process run: a real `pycollective bench` writes the JSON that the
    # verdict is read from (the goal's own runs take 64 MiB buffers and minutes).
    small = _goal5_run("--budget", "0.05", "--rounds", "1")
    monkeypatch.setattr(goals, "goal_runs", lambda: {5: [small]})
    out = tmp_path / "runs"
    verdicts_path = tmp_path / "verdicts.json"
    status = goals.main(["--goals", "5", "--out", str(out), "--json", str(verdicts_path)])
    [verdict] = json.loads(verdicts_path.read_text())
    assert verdict["goal"] == 5 and verdict["met"] in (True, False), verdict
    assert verdict["measured"].startswith("inproc2 ") and verdict["measured"].endswith("x")
    assert status == (0 if verdict["met"] else 1)
    data = json.loads((out / "new_inproc2.json").read_text())
    ratio = goals.new_output_ratio(data)
    assert ratio is not None and f"{ratio:.2f}x" in verdict["measured"]


@pytest.mark.timeout(120)
def test_a_run_past_its_time_is_stopped_and_the_goal_not_measured(tmp_path, monkeypatch):
    slow = _goal5_run("--budget", "30", "-n", "1000000")
    monkeypatch.setattr(goals, "goal_runs", lambda: {5: [slow]})
    monkeypatch.setattr(goals, "RUN_TIMEOUT_S", 1)
    [verdict] = goals.evaluate([5], str(tmp_path), lambda line: None)
    assert verdict.met is None
    assert "new_inproc2 ran past 1 s and was stopped" in verdict.measured


@pytest.mark.timeout(120)
def test_a_run_of_processes_past_its_time_takes_its_ranks_with_it(tmp_path, monkeypatch):
    # The ranks' process groups are their own: bench-goals interrupts bench, which stops them.
    # The ranks' command lines name their job file, which goes to TMPDIR.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    ranks = goals.Run(
        "procs2", ["--world", "2", "-b", "64M", "-e", "64M", "--peers", "", "--budget", "30"]
    )
    monkeypatch.setattr(goals, "goal_runs", lambda: {5: [ranks]})
    monkeypatch.setattr(goals, "RUN_TIMEOUT_S", 8)
    (tmp_path / "runs").mkdir()
    [verdict] = goals.evaluate([5], str(tmp_path / "runs"), lambda line: None)
    assert "procs2 ran past 8 s and was stopped" in verdict.measured
    time.sleep(0.5)
    assert processes_naming(str(tmp_path)) == []


def test_unknown_goals_are_refused():
    with pytest.raises(SystemExit):
        goals.main(["--goals", "7"])
