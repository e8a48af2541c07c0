"""ReplicaGroup: every replica of every process as one native group (hierarchical all-reduce),
against numpy, in separate processes under a hard deadline."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from multiproc import run_ranks
from reference import FLOATS, assert_close, make_inputs, reduce_ref

SIZES = [0, 1, 2, 7, 3001, 1 << 18]


def _allreduce_matches_numpy(rank, n, local, dtypes):
    import pycollective as pc

    pc.init()
    group = pc.ReplicaGroup(local)
    assert group.size == n * local
    checks = 0
    for dtype in dtypes:
        for count in SIZES:
            for op in ("sum", "max", "avg"):
                if op == "avg" and dtype not in FLOATS:
                    continue
                xs = make_inputs(dtype, op, n * local, count, seed=count + 11)
                mine = xs[rank * local : (rank + 1) * local]
                want = reduce_ref(xs, op)
                got = group.allreduce([x.copy() for x in mine], op=op)
                for r, y in enumerate(got):
                    assert_close(y, want, op, n * local, f"rank {rank} replica {r} {dtype} {op}")
                # In place: the inputs become the result; out=: the caller's buffers do.
                ins = [x.copy() for x in mine]
                assert group.allreduce(ins, op=op, inplace=True)[0] is ins[0]
                outs = [np.empty_like(x) for x in mine]
                group.allreduce(mine, op=op, out=outs)
                for y in ins + outs:
                    assert_close(y, want, op, n * local, f"rank {rank} in place/out {dtype} {op}")
                checks += 1
    # Every replica of every process holds the same bits.
    x = make_inputs("float32", "sum", n * local, 1000, seed=5)
    got = group.allreduce(x[rank * local : (rank + 1) * local])
    digest = np.frombuffer(got[0].tobytes(), np.uint8)
    assert all(g.tobytes() == got[0].tobytes() for g in got)
    gathered = pc.allgather(digest.astype(np.int64))
    assert all((gathered[i] == gathered[0]).all() for i in range(n))
    pc.shutdown()
    return checks


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "n,local,transport", [(2, 2, "shm"), (2, 3, "tcp"), (3, 2, "shm"), (2, 2, "grpc")]
)
def test_allreduce_over_every_replica_of_every_process(n, local, transport):
    dtypes = ["float32", "int32"] if transport != "grpc" else ["float32"]
    res = run_ranks(
        _allreduce_matches_numpy,
        n,
        local,
        dtypes,
        env={"PYCOLLECTIVE_TRANSPORT": transport},
        timeout=120,
    )
    assert res == [res[0]] * n and res[0] > 0


def _wrong_calls(rank, n):
    import pycollective as pc

    pc.init()
    group = pc.ReplicaGroup(2)
    errors = []
    for call in (
        lambda: group.allreduce([np.ones(3)]),  # one tensor for two replicas
        lambda: group.allreduce([np.ones(3), np.ones(4)]),  # replicas disagree
        lambda: group.allreduce([np.ones(3, np.int32)] * 2, op="avg"),
    ):
        try:
            call()
            errors.append(None)
        except Exception as exc:
            errors.append(type(exc).__name__)
    # Still usable after calls refused before anything moved.
    y = group.allreduce([np.full(4, float(rank)), np.full(4, 1.0)])
    pc.shutdown()
    return errors, y[1].tolist()


@pytest.mark.timeout(60)
def test_refused_calls_leave_the_group_usable():
    res = run_ranks(_wrong_calls, 2, timeout=45)
    for errors, y in res:
        assert errors == ["ValueError", "ValueError", "TypeError"], errors
        assert y == [3.0] * 4  # ranks 0 and 1 plus one 1.0 per process


def _closed_groups(rank, n):
    from multiproc import expect_error

    import pycollective as pc

    pc.init()

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    with pc.ReplicaGroup(2) as group:  # the first group starts what every later one reuses
        group.allreduce([np.ones(4), np.ones(4)])
    before = open_fds()
    for _ in range(6):
        group = pc.ReplicaGroup(2)
        got = group.allreduce([np.full(4, rank + 1.0), np.full(4, rank + 1.0)])
        assert all((y == n * (n + 1)).all() for y in got)  # two replicas of each process
        group.close()
        group.close()  # a second close does nothing
    after = open_fds()
    closed = expect_error(lambda: group.allreduce([np.ones(4), np.ones(4)]))
    # The default group goes on, and so does a new ReplicaGroup.
    assert pc.allreduce(np.ones(3))[0] == n
    with pc.ReplicaGroup(2) as group:
        assert group.allreduce([np.ones(2), np.ones(2)])[1][0] == 2 * n
    pc.shutdown()
    return before, after, closed[:2]


@pytest.mark.timeout(90)
def test_close_releases_the_links_of_the_group():
    # tcp: each group's links are sockets, which /proc/self/fd counts.
    res = run_ranks(_closed_groups, 2, timeout=60, env={"PYCOLLECTIVE_TRANSPORT": "tcp"})
    for before, after, (name, msg) in res:
        assert after <= before, f"{after - before} descriptors left open by 6 closed groups"
        assert name == "ValueError" and "ReplicaGroup was closed" in msg, (name, msg)


def _peer_dies(rank, n):
    import pycollective as pc

    pc.init(timeout=30)
    group = pc.ReplicaGroup(2)
    group.allreduce([np.ones(8), np.ones(8)])
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        group.allreduce([np.ones(1 << 20, np.float32)] * 2)
    except pc.CollectiveError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None, "", time.monotonic() - start


@pytest.mark.timeout(60)
def test_a_dead_process_fails_the_group_fast():
    res = run_ranks(_peer_dies, 3, timeout=45, expect_exit={1: None})
    for r in (0, 2):
        name, msg, seconds = res[r]
        assert name in ("RemoteError", "Aborted"), res[r]
        assert "rank 1" in msg or "replica" in msg, msg
        # Well below the collective's 30 s timeout: the link or the abort broadcast told it
        # (the bound leaves room for a loaded machine, like tests/test_failures.py's).
        assert seconds < 8.0, f"rank {r} took {seconds:.1f} s to notice"


@pytest.mark.timeout(120)
def test_the_benchmark_runs_and_checks_its_results(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "pycollective.cli", "run", "-n", "2", "--timeout", "90", "--"]
        + [sys.executable, "-m", "pycollective.bench.replica_bench", "--max-bytes", "262144"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| 256 KiB |" in res.stdout and "speed-up" in res.stdout
