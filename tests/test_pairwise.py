"""Pairwise collectives of process groups (alltoall with even and uneven splits, gather, scatter,
send/recv) against numpy, on 3 processes over shm and tcp, under a hard deadline."""

from __future__ import annotations

import numpy as np
import pytest
from multiproc import run_ranks
from reference import ALL_DTYPES


def _block(dtype, src, dst, rows, width=3):
    """What rank src sends rank dst: `rows` rows of values that name both ranks."""
    import ml_dtypes  # noqa: F401  (bfloat16)

    base = np.arange(rows * width).reshape(rows, width) % 7 + 10 * src + dst
    return base.astype(np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else dtype)


def _pairwise(rank, n, transport):
    import pycollective as pc

    world = pc.init(transport=transport)
    checks = 0
    for dtype in ALL_DTYPES:
        # Even alltoall: block p of every rank goes to rank p.
        x = np.concatenate([_block(dtype, rank, p, 2) for p in range(n)])
        y = pc.alltoall(x)
        want = np.concatenate([_block(dtype, p, rank, 2) for p in range(n)])
        assert y.tobytes() == want.tobytes(), (dtype, "alltoall")
        # Uneven: rank r sends r + p rows to rank p (0 rows included), into a given out=.
        sends = [(rank + p) % 3 for p in range(n)]
        recvs = [(p + rank) % 3 for p in range(n)]
        x = np.concatenate([_block(dtype, rank, p, sends[p]) for p in range(n)])
        out = np.zeros((sum(recvs), 3), x.dtype)
        y = pc.alltoall(x, out=out, send_counts=sends, recv_counts=recvs)
        assert y is out
        want = np.concatenate([_block(dtype, p, rank, recvs[p]) for p in range(n)])
        assert out.tobytes() == want.tobytes(), (dtype, "alltoallv")
        # Lists, asynchronously.
        work = world.alltoall_async(
            [_block(dtype, rank, p, 1 + p) for p in range(n)],
            [np.empty((1 + rank, 3), x.dtype) for _ in range(n)],
        )
        got = work.wait(timeout=30)
        for p in range(n):
            assert got[p].tobytes() == _block(dtype, p, rank, 1 + rank).tobytes()
        for root in range(n):
            g = pc.gather(_block(dtype, rank, root, 4), root=root)
            if rank == root:
                assert (
                    g.tobytes() == np.stack([_block(dtype, p, root, 4) for p in range(n)]).tobytes()
                )
            else:
                assert g is None
            chunks = (
                np.stack([_block(dtype, root, p, 2) for p in range(n)]) if rank == root else None
            )
            mine = np.empty((2, 3), x.dtype)
            assert pc.scatter(chunks, mine, root=root) is mine
            assert mine.tobytes() == _block(dtype, root, rank, 2).tobytes()
        checks += 1
    # send/recv around a ring (even ranks send first, so no pair waits on itself) and a tag.
    g = world
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    buf = np.empty(1000, np.float32)
    order = [("send", nxt), ("recv", prv)] if rank % 2 == 0 else [("recv", prv), ("send", nxt)]
    for what, peer in order:
        if what == "send":
            g.send(np.full(1000, rank, np.float32), peer, tag=5)
        else:
            assert g.recv(buf, peer, tag=5) is buf
    assert (buf == prv).all()
    # Ranks 0 and 1 talk while rank 2 stays out: pairs keep their own sequence numbers.
    if rank == 0:
        g.send(np.arange(10.0), 1)
    elif rank == 1:
        r = np.empty(10)
        g.recv(r, 0)
        assert (r == np.arange(10.0)).all()
    # A sub-group made by name (members only).
    sub = pc.new_group([0, 2], name="evens")
    if sub is not None:
        z = sub.alltoall(np.array([10 * rank, 10 * rank + 1], np.int64))
        assert list(z) == [0 + sub.rank, 20 + sub.rank]
    pc.barrier()
    pc.shutdown()
    return checks


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_pairwise_collectives(transport):
    assert run_ranks(_pairwise, 3, transport, timeout=90) == [len(ALL_DTYPES)] * 3


def _mismatch(rank, n):
    import pycollective as pc

    pc.init()
    # Rank 1 expects 5 elements where rank 0 sends 4: both fail, naming the call.
    try:
        if rank == 0:
            pc.send(np.zeros(4, np.float32), 1)
            pc.barrier()  # fails once rank 1 aborted the group: both leave at once
        else:
            pc.recv(np.zeros(5, np.float32), 0)
    except pc.CollectiveError as exc:
        return str(exc)
    return "no error"


def test_send_recv_mismatch_fails():
    msgs = run_ranks(_mismatch, 2, timeout=60)
    assert "send/recv" in msgs[1] and "rank 0" in msgs[1], msgs
