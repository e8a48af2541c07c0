"""Never hang, never corrupt: timeouts, dead and frozen ranks, mismatched calls, bad tokens.
Each failure's message is checked for what a user needs: which rank, which collective, what
differed, what to do."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from multiproc import expect_error, run_ranks


def _timeout(rank, n):
    import pycollective as pc

    pc.init()
    if rank == 0:
        res = expect_error(lambda: pc.allreduce(np.ones(10), algo="ring", timeout=1.0))
    else:
        time.sleep(3)  # never calls the collective
        res = None
    return res


@pytest.mark.timeout(60)
def test_timeout_names_rank_collective_seq_and_peer():
    res = run_ranks(_timeout, 2, timeout=40)[0]
    assert res[0] == "CollectiveTimeout", res
    assert "[rank 0/2] allreduce#0 (ring, float64, 10 elems" in res[1]
    assert "timed out after 1 s waiting for rank 1" in res[1] and "PYCOLLECTIVE_TIMEOUT" in res[1]
    assert res[2] < 5


def _fast_path_times_out(rank, n, call):
    import pycollective as pc

    pc.init(timeout=1.0)
    if call == "plan":
        run = pc.prepare_allreduce(np.ones(10), algo="ring")
    else:
        run = pc.barrier  # the default group's barrier, with the group's timeout
    if rank == 1:
        time.sleep(3)  # rank 0's call times out meanwhile
    return expect_error(run)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", ["plan", "barrier"])
def test_fast_path_failure_is_explained_like_any_call(call):
    # plan() runs natively, pc.barrier() without ProcessGroup's frames: their failures must
    # still go through the group's explain_failure, which tells the coordinator (rank 0) and
    # adds the cause another rank reported (rank 1).
    res = run_ranks(_fast_path_times_out, 2, call, timeout=40)
    assert res[0][0] == "CollectiveTimeout", res[0]
    assert ("allreduce#0 (ring, float64, 10 elems" if call == "plan" else "barrier") in res[0][1]
    assert res[1][0] in ("RemoteError", "Aborted"), res[1]
    # The coordinator's word: rank 0 reported its timeout, and rank 1 heard it.
    assert "rank 0 (host" in res[1][1] and "aborted the group" in res[1][1], res[1]
    assert "timed out after 1 s" in res[1][1], res[1]


def _dies_mid_collective(rank, n, how, collective="allreduce"):
    import pycollective as pc
    from pycollective import fused_update as fu

    pc.init(timeout=30)
    pc.barrier()
    if rank == 1:
        time.sleep(0.5)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    if collective == "slots":  # a small call on the host segment (algorithms/slots.cc)
        return expect_error(lambda: pc.allreduce(np.ones(4, np.float32), algo="slots"))
    x = np.ones(1 << 20, np.float32)
    if collective == "allreduce_apply":
        update = fu.ReplicatedTensor([x], [np.zeros_like(x)])
        return expect_error(lambda: fu.allreduce_apply("sgd", fu.Hyper(lr=1.0), [update]))
    return expect_error(lambda: pc.allreduce(x, algo="ring"))


# A death must be noticed through the links or the abort broadcast, not because the dead rank
# stopped heartbeating: that window is pushed past the tests' bounds.
_NO_HEARTBEAT_DETECTION = {"PYCOLLECTIVE_HEARTBEAT_TIMEOUT": "30"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "shm", "grpc"])
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_dead_rank_is_reported_fast(how, transport):
    res = run_ranks(
        _dies_mid_collective,
        3,
        how,
        timeout=40,
        env={"PYCOLLECTIVE_TRANSPORT": transport, **_NO_HEARTBEAT_DETECTION},
        expect_exit={1: None},
    )
    for r in (0, 2):
        name, msg, seconds = res[r]
        assert name in ("RemoteError", "Aborted"), res[r]
        assert "rank 1" in msg, msg
        # Noticed through the link or the abort broadcast (well under a second when the machine
        # is idle). The heartbeat window is set far above the bound, so passing cannot mean the
        # death went unnoticed until a rank stopped answering; the bound leaves room for a
        # loaded machine.
        assert seconds < 8.0, f"rank {r} took {seconds:.1f} s to notice"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "collective, how", [("allreduce_apply", "kill"), ("slots", "kill"), ("slots", "exit")]
)
def test_dead_rank_in_a_fused_update_or_on_the_host_segment_is_reported_fast(collective, how):
    res = run_ranks(
        _dies_mid_collective,
        3,
        how,
        collective,
        timeout=40,
        env=_NO_HEARTBEAT_DETECTION,
        expect_exit={1: None},
    )
    for r in (0, 2):
        name, msg, seconds = res[r]
        assert name in ("RemoteError", "Aborted"), res[r]
        assert "rank 1" in msg, msg
        # Noticed through the link or the abort broadcast (well under a second when the machine
        # is idle). The heartbeat window is set far above the bound, so passing cannot mean the
        # death went unnoticed until a rank stopped answering; the bound leaves room for a
        # loaded machine.
        assert seconds < 8.0, f"rank {r} took {seconds:.1f} s to notice"


def _frozen_rank(rank, n):
    import pycollective as pc

    pc.init(timeout=30)
    pc.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(30)
        return None
    return expect_error(lambda: pc.allreduce(np.ones(100), algo="ring"))


@pytest.mark.timeout(60)
def test_frozen_rank_is_reported_within_heartbeat_window():
    res = run_ranks(
        _frozen_rank,
        2,
        timeout=30,
        expect_exit={1: None},
        env={"PYCOLLECTIVE_HEARTBEAT_TIMEOUT": "2"},
    )
    name, msg, seconds = res[0]
    assert name in ("Aborted", "RemoteError"), res[0]
    assert "rank 1" in msg and "heartbeat" in msg.lower(), msg
    assert seconds < 2 + 3, seconds


def _mismatch(rank, n, what):
    import pycollective as pc

    pc.init(timeout=10)
    x = np.arange(12, dtype=np.float32)
    if what == "collective":
        call = (lambda: pc.allreduce(x)) if rank == 0 else (lambda: pc.broadcast(x))
    elif what == "shape":
        y = x.reshape(3, 4) if rank == 0 else x.reshape(4, 3)
        call = lambda: pc.allreduce(y, algo="ring")  # noqa: E731
    elif what == "dtype":
        y = x if rank == 0 else x.astype(np.float64)
        call = lambda: pc.allreduce(y, algo="ring")  # noqa: E731
    elif what == "op":
        call = lambda: pc.allreduce(x, op="sum" if rank == 0 else "max", algo="ring")  # noqa
    elif what == "algo":
        call = lambda: pc.allreduce(x, algo="ring" if rank == 0 else "reduce_to_one")  # noqa
    elif what == "count":
        call = lambda: pc.allreduce(x if rank == 0 else x[:5], algo="ring")  # noqa: E731
    elif what == "rule":
        from pycollective import fused_update as fu

        update = fu.ReplicatedTensor([x.copy()], [np.zeros_like(x)], [[np.zeros_like(x)]])
        rule = "momentum" if rank == 0 else "nesterov"  # same slots: only the header tells
        call = lambda: fu.allreduce_apply(rule, fu.Hyper(lr=1.0), [update])  # noqa: E731
    elif what == "fused":
        from pycollective import fused_update as fu

        update = fu.ReplicatedTensor([x.copy()], [np.zeros_like(x)])
        call = (
            (lambda: fu.allreduce_apply("sgd", fu.Hyper(lr=1.0), [update]))
            if rank == 0
            else (lambda: pc.allreduce(x, algo="ring"))
        )
    return expect_error(call)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "what,text",
    [
        ("collective", "collective: here"),
        ("shape", "same element count in a different shape"),
        ("dtype", "dtype: here"),
        ("op", "op: here"),
        ("algo", "algorithm: here"),
        ("count", "element count: here"),
        ("fused", "collective: here"),
        ("rule", "update rule: here"),
        ("rule", "nesterov"),  # the rule is named, not numbered (the optimizer layer names it)
        ("algo", "reduce_to_one"),  # the algorithm is named (the registry names it)
    ],
)
def test_mismatched_calls_fail_on_every_rank(what, text):
    res = run_ranks(_mismatch, 2, what, timeout=40)
    for r, (name, msg, seconds) in enumerate(res):
        assert name in ("ProtocolError", "RemoteError", "Aborted"), (r, res[r])
        assert text in msg, (r, msg)
        assert seconds < 20  # at once, not at the collective timeout (60 s); room for load


def _wrong_token(rank, n):
    import pycollective as pc

    try:
        pc.init(connect_timeout=4)
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return ["joined", ""]


@pytest.mark.timeout(60)
def test_wrong_token_is_refused():
    res = run_ranks(
        _wrong_token,
        2,
        timeout=40,
        per_rank_env=[{}, {"PYCOLLECTIVE_TOKEN": "not-the-cluster-token"}],
    )
    assert res[1][0] != "joined" and "token" in res[1][1].lower(), res[1]
    assert res[0][0] != "joined", res[0]


def _group_is_unusable_after_failure(rank, n):
    import pycollective as pc

    pc.init(timeout=1)
    if rank == 0:
        first = expect_error(lambda: pc.allreduce(np.ones(3)))
        second = expect_error(lambda: pc.allreduce(np.ones(3)))
        return [first[0], second[0], second[1]]
    time.sleep(2.5)
    return None


@pytest.mark.timeout(60)
def test_failed_group_says_so():
    first, second, msg = run_ranks(_group_is_unusable_after_failure, 2, timeout=30)[0]
    assert first == "CollectiveTimeout" and second == "Aborted"
    assert "create a new group" in msg
