"""Elastic groups: processes die (SIGKILL, rank 0 included), the survivors re-form the group in
the same processes (``pycollective.reinit``), with replacements the launcher starts or smaller.

The jobs run the real launcher (``pycollective run -n MIN:MAX``) on tests/elastic_churn.py under
a hard timeout; the round controller is also tested on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_launcher import launcher_env

import pycollective as pc
from pycollective.rendezvous.elastic import _ASSIGN, _JOIN, ElasticStore

CHURN = str(Path(__file__).with_name("elastic_churn.py"))


def run_churn(tmp_path: Path, *launch: str, victims: str, timeout: float = 90):
    outdir = tmp_path / "out"
    outdir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", *launch, "--timeout", str(timeout - 10)]
        + [sys.executable, CHURN, str(outdir), victims],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    logs = [json.loads(p.read_text()) for p in sorted(outdir.glob("pid-*.json"))]
    return proc, logs


def survivors_entries(logs: list[dict]) -> list[tuple[dict, dict]]:
    return [(log, g) for log in logs for g in log["groups"] if "error" in g]


@pytest.mark.timeout(120)
def test_replacements_rejoin_and_nothing_leaks(tmp_path):
    # Ranks 0 and 1 outlive five kills of the last rank; the fifth kill takes rank 0 (the
    # coordinator's host) instead, so the rank-0 role moves to the old rank 1.
    victims = "2,2,2,2,0,2"
    proc, logs = run_churn(tmp_path, "-n", "3", "--max-restarts", "6", victims=victims)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 restart(s)" in proc.stderr
    finished = [log for log in logs if log.get("done")]
    assert len(finished) == 3  # two replacements and one first-generation process at the end
    assert len(logs) == 3 + 6
    for _, group in survivors_entries(logs):
        assert group["detect_s"] < 10.0, group
        assert group["reformed_s"] < 20.0, group
    # Every group had 3 members, and each process kept its order: the old rank 1 is rank 0
    # once rank 0 died.
    for log in logs:
        assert all(g["size"] == 3 for g in log["groups"])
    longest = max(logs, key=lambda log: len(log["groups"]))
    assert len(longest["groups"]) == 7
    assert [g["rank"] for g in longest["groups"]] == [1, 1, 1, 1, 1, 0, 0]
    coordinator_lost = longest["groups"][4]["error"]
    assert "coordinator" in coordinator_lost and "rank 0" in coordinator_lost, coordinator_lost
    # Threads and file descriptors after each re-formation: flat per role (rank 0 hosts the
    # coordinator). The coordinator's gRPC pool is counted apart: it starts workers as calls
    # overlap, up to its bound (4 per rank + 8). A leak of one link or thread per re-formation
    # would grow by 5 over the longest-lived process's groups.
    for log in logs:
        for role in (True, False):
            seen = [g for g in log["groups"] if (g["rank"] == 0) is role]
            if len(seen) >= 2:
                assert max(g["threads"] for g in seen) - seen[0]["threads"] <= 1, log
                assert max(g["fds"] for g in seen) - seen[0]["fds"] <= 1, log
            assert all(g["pool"] <= 4 * 3 + 8 for g in seen), log


@pytest.mark.timeout(120)
def test_group_shrinks_when_rank_0_dies_without_restarts(tmp_path):
    proc, logs = run_churn(tmp_path, "-n", "2:3", victims="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "re-form the group without it" in proc.stderr
    entries = survivors_entries(logs)
    assert len(entries) == 2
    for log, group in entries:
        assert group["detect_s"] < 10.0
        assert "coordinator" in group["error"] and "rank 0" in group["error"], group["error"]
        assert [g["size"] for g in log["groups"]] == [3, 2]
    assert sorted(log["groups"][1]["rank"] for log, _ in entries) == [0, 1]


@pytest.mark.timeout(120)
def test_job_fails_below_the_minimum(tmp_path):
    proc, logs = run_churn(tmp_path, "-n", "2:3", victims="0,0")
    assert proc.returncode == 128 + 9, proc.stderr[-3000:]
    assert "fewer than the minimum 2" in proc.stderr


def _join(store: ElasticStore, uid: str, pid: int, previous_rank: int, min_size: int = 1):
    record = {"node": "elsewhere", "pid": pid, "previous_rank": previous_rank}
    record["min_size"] = min_size
    store._service.local_set(_JOIN + uid, json.dumps(record).encode())


def _placed(store: ElasticStore) -> dict[str, dict]:
    return {
        k[len(_ASSIGN) :]: json.loads(v) for k, v in store._service.local_items(_ASSIGN).items()
    }


def test_round_controller_orders_survivors_first_and_waits_for_the_live():
    live = [3]
    store = ElasticStore("t0ken", 2, 3, live_count=lambda: live[0], last_call=5.0)
    _join(store, "new", 10, -1)
    _join(store, "old2", 11, 2)
    assert store.step(0.0) is None  # 2 of the 3 live joined: wait for the third
    _join(store, "old0", 12, 0)
    assert store.step(0.1) is not None
    placed = _placed(store)
    assert [placed[u]["rank"] for u in ("old0", "old2", "new")] == [0, 1, 2]
    assert {p["world_size"] for p in placed.values()} == {3}
    # Next round: two join, the third live process stays away: the last call closes it at 2.
    _join(store, "a", 13, 1)
    _join(store, "b", 14, 0)
    assert store.step(1.0) is None
    assert store.step(5.9) is None
    assert store.step(6.1) is not None
    placed = _placed(store)
    assert (placed["b"]["rank"], placed["a"]["rank"], placed["a"]["round"]) == (0, 1, 2)
    # A joiner's own minimum holds the round even when every live process joined.
    live[0] = 2
    _join(store, "c", 15, 0, min_size=3)
    _join(store, "d", 16, 1)
    assert store.step(20.0) is None and store.step(40.0) is None


@pytest.mark.timeout(30)
def test_a_join_that_times_out_says_whose_minimum_it_waited_for():
    """A store started with a minimum of 3 and one joiner asking for 1: the joiner's error must
    not say it waited for a group of 1 (its own minimum), which looks as if one were enough."""
    from pycollective.rendezvous import RendezvousError
    from pycollective.rendezvous.elastic import join

    with ElasticStore("t0ken", 3, 4, live_count=lambda: 1, last_call=0.1) as store:
        with pytest.raises(RendezvousError) as caught:
            join(store.address, "t0ken", previous_rank=-1, min_size=1, timeout=1.5)
    msg = str(caught.value)
    assert "no group formed" in msg and "asked for at least 1" in msg, msg
    assert "store's own minimum" in msg, msg


@pytest.mark.timeout(60)
def test_store_takes_more_joiners_than_a_worlds_handler_threads():
    """Every joiner blocks one of the store's handler threads in get() until its round forms;
    14 joiners (over the 12 threads of a world of one) all get their places."""
    import threading
    import time

    from pycollective.rendezvous.elastic import join

    n = 14
    places, errors = [], []

    def joiner(address):
        try:
            assignment, client = join(address, "t0ken", previous_rank=-1, min_size=1, timeout=30)
            client.close()
            places.append(assignment)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with ElasticStore("t0ken", n, n, live_count=lambda: n, last_call=5.0) as store:
        threads = [threading.Thread(target=joiner, args=(store.address,)) for _ in range(n)]
        for t in threads[:12]:  # these wait in get() when the last two come to join
            t.start()
        time.sleep(1.0)
        for t in threads[12:]:
            t.start()
        for t in threads:
            t.join(45)
    assert not errors, errors[0]
    assert sorted(p.rank for p in places) == list(range(n))
    assert {p.world_size for p in places} == {n}


def test_min_size_needs_an_elastic_launcher(monkeypatch):
    monkeypatch.delenv("PYCOLLECTIVE_ELASTIC_STORE", raising=False)
    with pytest.raises(ValueError, match="elastic rendezvous"):
        pc.init(min_size=2)
    assert not pc.is_initialized()


@pytest.mark.timeout(60)
def test_launcher_rejects_bad_elastic_counts():
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", "-n", "3:2", "true"],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "MIN <= MAX" in proc.stderr
    assert os.path.exists(CHURN)


def _timeout_then_reinit(rank, n):
    import time

    import numpy as np

    import pycollective as pc

    pc.init(timeout=30)
    outcomes = []
    for _ in range(3):  # fail and re-form three times in the same processes
        if rank == 0:
            try:
                pc.allreduce(np.ones(4), timeout=0.5)  # rank 1 is not calling it yet
            except pc.CollectiveError as exc:
                outcomes.append(type(exc).__name__)
        else:
            time.sleep(1.0)
            try:
                pc.allreduce(np.ones(4))  # the group was aborted meanwhile
            except pc.CollectiveError as exc:
                outcomes.append(type(exc).__name__)
        group = pc.reinit()  # a plain launch: the same ranks, the same coordinator address
        outcomes.append(float(group.allreduce(np.full(4, rank + 1.0))[0]))
    pc.shutdown()
    return outcomes


@pytest.mark.timeout(120)
def test_all_ranks_alive_reinit_after_a_timeout_without_an_elastic_launcher():
    from multiproc import run_ranks

    res = run_ranks(_timeout_then_reinit, 2, timeout=90)
    assert res[0] == ["CollectiveTimeout", 3.0] * 3, res
    assert res[1][1::2] == [3.0] * 3 and all(isinstance(e, str) for e in res[1][::2]), res
