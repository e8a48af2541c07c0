"""Process groups: every collective x algorithm x dtype x world size x transport against numpy,
in separate processes under a hard deadline."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from multiproc import run_ranks
from reference import ALL_DTYPES, FLOATS, assert_close, make_inputs, reduce_ref

ALGOS = ["ring", "halving_doubling", "hierarchical", "reduce_to_one", "auto"]
SIZES = [0, 1, 5, 61, 3001]
TRANSPORTS = ["tcp", "shm", "grpc"]


def _all_collectives(rank, n, transport, dtypes):
    import pycollective as pc

    pc.init(transport=transport)
    checks = 0
    for dtype in dtypes:
        for count in SIZES:
            for op in ("sum", "max", "avg", "prod"):
                if op == "avg" and dtype not in FLOATS:
                    continue
                xs = make_inputs(dtype, op, n, count, seed=count + 3)
                want = reduce_ref(xs, op)
                for algo in ALGOS:
                    y = pc.allreduce(xs[rank], op=op, algo=algo)
                    assert_close(y, want, op, n, f"rank {rank} {algo} {dtype} {op} {count}")
                    checks += 1
            xs = make_inputs(dtype, "sum", n, count, seed=count)
            for algo in ("ring", "halving_doubling", "reduce_to_one"):
                g = pc.allgather(xs[rank], algo=algo)
                assert np.asarray(g).tobytes() == np.stack(xs).tobytes(), (algo, dtype, count)
                root = count % n
                b = pc.broadcast(xs[rank], root=root, algo=algo)
                assert np.asarray(b).tobytes() == xs[root].tobytes(), (algo, dtype, count)
                red = pc.reduce(xs[rank], root=root, algo=algo)
                if rank == root:
                    assert_close(red, reduce_ref(xs, "sum"), "sum", n, f"reduce {algo}")
                else:
                    assert red is None
                if algo != "halving_doubling" or n & (n - 1) == 0:
                    part = pc.reduce_scatter(xs[rank], algo=algo)
                    full = reduce_ref(xs, "sum").reshape(-1)
                    base, extra = divmod(count, n)
                    start = rank * base + min(rank, extra)
                    assert_close(
                        np.asarray(part).reshape(-1),
                        full[start : start + base + (rank < extra)],
                        "sum",
                        n,
                        "rs",
                    )
                checks += 4
    pc.barrier()
    # Results are bitwise identical on every rank: gather a digest of one float sum.
    x = make_inputs("float32", "sum", n, 1000, seed=9)[rank]
    digest = np.frombuffer(pc.allreduce(x, algo="ring").tobytes(), np.uint8).astype(np.int64)
    gathered = pc.allgather(digest)
    assert all((gathered[i] == gathered[0]).all() for i in range(n))
    pc.shutdown()
    return checks


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_across_processes(n, transport):
    dtypes = ALL_DTYPES if n in (2, 3) and transport != "grpc" else ["float32", "int64", "bfloat16"]
    results = run_ranks(_all_collectives, n, transport, dtypes, timeout=150)
    assert len(set(results)) == 1 and results[0] > 0


def _hierarchical_fake_hosts(rank, n):
    import pycollective as pc

    pc.init()
    assert pc.local_size() == 2 and pc.local_rank() == rank % 2
    checks = 0
    for count in SIZES + [100_003]:
        xs = make_inputs("float64", "sum", n, count, seed=count)
        for algo in ("hierarchical", "ring", "auto"):
            y = pc.allreduce(xs[rank], algo=algo)
            assert_close(y, reduce_ref(xs, "sum"), "sum", n, f"{algo} {count}")
            checks += 1
    pc.shutdown()
    return checks


@pytest.mark.timeout(120)
def test_hierarchical_with_two_fake_hosts():
    """Two "hosts" x two ranks on one machine: shm inside a host, tcp across."""
    hosts = [{"PYCOLLECTIVE_HOST_ID": f"host{r // 2}"} for r in range(4)]
    assert run_ranks(_hierarchical_fake_hosts, 4, per_rank_env=hosts, timeout=100)[0] > 0


def _subgroups(rank, n):
    import pycollective as pc

    pc.init()
    evens = pc.new_group([0, 2])
    odds = pc.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    other = odds if rank % 2 == 0 else evens
    assert other is None and mine.size == 2 and mine.rank == rank // 2
    y = pc.allreduce(np.array([rank], np.int64), group=mine)
    pc.barrier(group=mine)
    z = pc.allreduce(np.array([1], np.int64))  # the default group still works in between
    b = pc.broadcast(np.array([rank], np.int64), root=1, group=mine)
    pc.shutdown()
    return [int(y[0]), int(z[0]), int(b[0])]


@pytest.mark.timeout(90)
def test_new_group():
    res = run_ranks(_subgroups, 4, timeout=60)
    assert res == [[2, 4, 2], [4, 4, 3], [2, 4, 2], [4, 4, 3]]


def _async_and_inplace(rank, n):
    import pycollective as pc

    pc.init()
    x = np.full(1000, rank + 1.0, np.float32)
    h = pc.allreduce_async(x)
    y = h.wait(timeout=30)
    assert h.is_completed()
    pc.allreduce(x, inplace=True)
    out = np.empty(1000, np.float32)
    got = pc.allreduce(np.ones(1000, np.float32), out=out)
    assert got is out
    pc.shutdown()
    return [float(y[0]), float(x[0]), float(out[0])]


@pytest.mark.timeout(60)
def test_async_inplace_out():
    assert run_ranks(_async_and_inplace, 2, timeout=45) == [[3.0, 3.0, 2.0]] * 2


def _dropped_async(rank, n):
    """Rank 0 gives up waiting on an async allreduce and drops its Work while rank 1 has not
    joined yet; the call's buffers (the contiguous copy of a strided input, the pooled output)
    must outlive the Work, or the worker thread writes into memory handed out again."""
    import gc
    import time

    import pycollective as pc
    from pycollective._calls import new_output
    from pycollective.errors import CollectiveTimeout

    pc.init()
    count = 1 << 19  # 2 MiB of float32: the output comes from the output pool
    base = (np.arange(2 * count) % 7).astype(np.float32) + rank
    x = base[::2]  # strided: the call runs on a copy only the Work holds
    want = 2 * (np.arange(0, 2 * count, 2) % 7).astype(np.float32) + 1
    if rank == 0:
        w = pc.allreduce_async(x)
        try:
            w.wait(timeout=0.05)
            raise AssertionError("rank 1 sleeps: the allreduce cannot be done yet")
        except CollectiveTimeout:
            pass
        del w
        gc.collect()
        # The next results of that size: the pool would hand them the dropped call's output.
        fresh = [new_output((count,), np.dtype(np.float32)) for _ in range(2)]
        for f in fresh:
            f.fill(-1.0)
        pc.barrier()  # runs after the dropped call: it is done by now
        untouched = all(bool((f == -1.0).all()) for f in fresh)
    else:
        time.sleep(1.0)
        y = pc.allreduce(x)
        pc.barrier()
        untouched = bool(np.array_equal(y, want))  # rank 0's input copy was intact
    again = pc.allreduce(x)
    pc.shutdown()
    return [untouched, bool(np.array_equal(again, want))]


@pytest.mark.timeout(60)
def test_dropped_async_work_keeps_its_buffers():
    assert run_ranks(_dropped_async, 2, timeout=45) == [[True, True]] * 2


def _single_rank(rank, n):
    import pycollective as pc

    pc.init()
    y = pc.allreduce(np.arange(4.0))
    try:  # in-process only: refused before anything moves, saying why
        pc.allreduce(np.arange(4.0), algo="inline")
        inline_error = "no error"
    except ValueError as exc:
        inline_error = str(exc)
    pc.shutdown()
    return [y.tolist(), inline_error]


def _watched_when_init_returns(rank, n):
    import pycollective as pc
    from pycollective import process_group

    pc.init()
    watched = None
    if rank == 0:  # the coordinator's own view, read the moment init returns
        state = process_group._world.service._state
        with state.cond:
            watched = sorted(state.last_heartbeat)
    pc.shutdown()
    return watched


@pytest.mark.timeout(90)
def test_init_returns_once_every_rank_is_watched():
    """Rank 0 serves the coordinator from Python threads: if it returned from init while
    another rank was still opening its abort watch, a GIL-holding call right after init (as
    mpi4py's MPI_Init is) stalled that rank's init until it failed."""
    for _ in range(3):  # a race when it fails: rank 0 usually finishes first
        watched = run_ranks(_watched_when_init_returns, 4, timeout=25)[0]
        assert watched == [0, 1, 2, 3], f"init returned on rank 0 with only {watched} watched"


@pytest.mark.timeout(60)
def test_world_of_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    [[values, inline_error]] = run_ranks(_single_rank, 1, timeout=45)
    assert values == [0.0, 1.0, 2.0, 3.0]
    assert (
        "'inline'" in inline_error and "in-process replicas (LocalCommunicator)" in inline_error
    ), inline_error
    # The harness's folder of logs and results goes with the ranks (a failure carries its logs).
    assert list(tmp_path.iterdir()) == []


def _torch_tensors(rank, n):
    import torch

    import pycollective as pc

    pc.init()
    y = pc.allreduce(torch.full((3,), float(rank + 1)))
    pc.shutdown()
    return [isinstance(y, torch.Tensor), y.tolist()]


@pytest.mark.timeout(60)
def test_torch_tensors_across_processes():
    pytest.importorskip("torch")
    assert run_ranks(_torch_tensors, 2, timeout=45) == [[True, [3.0, 3.0, 3.0]]] * 2


def _repeated_plain_calls(rank, n):
    """Plain calls on the same arrays, and on fresh arrays of the same layout, over and over
    (the group remembers the checked layouts of plain calls, pycollective/_call_memo.py), with
    the arrays changed in place between calls."""
    import pycollective as pc
    from pycollective.process_group import _group

    pc.init()
    total = n * (n + 1) / 2
    x = np.zeros(6, np.float32)
    y = np.empty_like(x)
    seen = []
    for step in range(4):
        x[:] = np.arange(6) * (rank + 1) + step  # new contents, same arrays
        assert pc.allreduce(x, out=y) is y
        np.testing.assert_allclose(y, np.arange(6) * total + n * step)
        fresh = pc.allreduce(x)  # a new result every call, never a remembered one
        assert all(fresh is not s for s in seen) and fresh is not y
        seen.append(fresh)
        np.testing.assert_allclose(fresh, y)
    memo = _group(None)._memo  # these plain calls take the path that makes no key
    assert memo.plain_out is not None and memo.plain_new is not None
    for s in seen[:-1]:  # earlier results are the caller's own: later calls left them alone
        assert s.shape == (6,)
    np.testing.assert_allclose(seen[0], np.arange(6) * total)
    for step in range(3):  # fresh arrays each call, one layout: each result is its own
        got = pc.allreduce(np.full(6, rank + step, np.float32), out=np.empty(6, np.float32))
        np.testing.assert_allclose(got, n * step + total - n)
    for _ in range(3):  # a result on the root only; the other ranks get None every time
        got = pc.reduce(np.full(4, rank + 1.0), root=0)
        assert (got is None) == (rank != 0)
        if rank == 0:
            np.testing.assert_allclose(got, total)
    strided = np.arange(12, dtype=np.float32)[::2]  # x's shape and dtype, other strides
    np.testing.assert_allclose(pc.allreduce(strided, out=y), np.arange(0, 12, 2) * n)
    x.shape = (2, 3)  # reshaped in place: a new shape of result
    assert pc.allreduce(x).shape == (2, 3)
    x.shape = (6,)
    errors = []
    z = np.full(5, rank + 1.0)
    for _ in range(3):
        z[:] = rank + 1.0
        assert pc.allreduce(z, inplace=True) is z
        np.testing.assert_allclose(z, total)
    z.flags.writeable = False  # in place into an array made read-only since: refused
    try:
        pc.allreduce(z, inplace=True)
        errors.append(None)
    except ValueError as exc:
        errors.append("read-only" in str(exc))
    assert float(pc.allreduce(z, op="max")[0]) == total  # another op is another call
    assert pc.allreduce(x, out=y, algo="ring") is y  # another algorithm too
    y.shape = (2, 3)  # out= reshaped in place no longer fits the result
    try:
        pc.allreduce(x, out=y)
        errors.append(None)
    except ValueError as exc:
        errors.append("shape" in str(exc))
    y.shape = (6,)
    y.flags.writeable = False  # nor does an out= made read-only
    try:
        pc.allreduce(x, out=y)
        errors.append(None)
    except ValueError as exc:
        errors.append("read-only" in str(exc))
    pc.shutdown()
    return errors


@pytest.mark.timeout(90)
def test_repeated_plain_calls_see_arrays_changed_in_place():
    assert run_ranks(_repeated_plain_calls, 2, timeout=75) == [[True, True, True]] * 2


def _large_plain_calls(rank, n):
    """Plain calls of 512 KiB are remembered too (the checks cost with ranks sharing cores), and
    so are calls with new results of 1 MiB and more, whose memory still comes from the output
    pool, a new array every call."""
    import pycollective as pc
    from pycollective.process_group import _group

    pc.init()
    total = n * (n + 1) / 2
    count = (512 << 10) // 4
    x = np.empty(count, np.float32)
    y = np.empty_like(x)
    for step in range(3):
        x[:] = np.arange(count) % 97 * (rank + 1) + step
        assert pc.allreduce(x, out=y) is y
        np.testing.assert_allclose(y, np.arange(count) % 97 * total + n * step)
    memo = _group(None)._memo
    remembered = memo.plain_out is not None
    big = np.full((1 << 20) // 4 * 2, rank + 1.0, np.float32)  # 2 MiB, new results
    results = [pc.allreduce(big) for _ in range(3)]  # the first on the full path
    for r in results:
        np.testing.assert_allclose(r, total)
    pooled = all(isinstance(r.base, pc._C.OutputBuffer) for r in results)
    distinct = len({r.ctypes.data for r in results}) == 3
    pc.shutdown()
    return [remembered, memo.plain_new is not None and pooled and distinct]


@pytest.mark.timeout(60)
def test_large_plain_calls_are_remembered():
    assert run_ranks(_large_plain_calls, 2, timeout=45) == [[True, True]] * 2


def _remembered_calls_refuse_what_the_full_path_refuses(rank, n):
    """Arguments equal to a remembered call's but refused by the full path stay refused: a
    byte-swapped array of the same shape and strides (numpy's '>f4' shares '<f4''s type number),
    op=0 (equal to ReduceOp.SUM) and root=0.0 (equal to 0). A remembered call on a group that
    was shut down says so."""
    import pycollective as pc
    from pycollective.process_group import _group

    pc.init()
    x, y = np.ones(6, np.float32), np.empty(6, np.float32)
    z = np.ones(6, np.float32)
    for _ in range(2):
        pc.allreduce(x, op=pc.ReduceOp.SUM, out=y)
        pc.allreduce(x, out=y)  # the plain call, remembered apart (CallMemo.plain_out)
        pc.reduce(x, root=0)
        pc.reduce(z, root=0, inplace=True)
    z.flags.writeable = False  # inplace=True refuses it on every rank, the root or not
    outcomes = []
    for call in (
        lambda: pc.allreduce(x.astype(">f4"), op=pc.ReduceOp.SUM, out=y),
        lambda: pc.allreduce(x, op=pc.ReduceOp.SUM, out=np.empty(6, ">f4")),
        lambda: pc.allreduce(x, op=0, out=y),
        lambda: pc.reduce(x, root=0.0),
        lambda: pc.reduce(z, root=0, inplace=True),
    ):
        try:
            call()
            outcomes.append("ran")
        except (TypeError, ValueError) as exc:
            outcomes.append(type(exc).__name__)
    group = _group(None)
    pc.shutdown()
    for call in (
        lambda: group.allreduce(x, op=pc.ReduceOp.SUM, out=y),
        lambda: group.allreduce(x, out=y),
    ):
        try:
            call()
            outcomes.append("ran")
        except RuntimeError as exc:
            outcomes.append("shut down" if "shut down" in str(exc) else str(exc))
    return outcomes


@pytest.mark.timeout(60)
def test_remembered_calls_refuse_what_the_full_path_refuses():
    want = ["TypeError", "TypeError", "ValueError", "ValueError", "ValueError"]
    want += ["shut down", "shut down"]
    assert (
        run_ranks(_remembered_calls_refuse_what_the_full_path_refuses, 2, timeout=45) == [want] * 2
    )


def _remembered_call_follows_a_new_tuned_table(rank, n):
    """A plain call the group remembers settles auto's choice, but not for good: when auto's
    inputs change (here a tuned table, given to rank 0 only) the next call chooses again. Rank 0
    then runs another algorithm than rank 1, which the frame headers report."""
    import pycollective as pc
    from pycollective import CollectiveError
    from pycollective._calls import KINDS
    from pycollective.process_group import _group

    pc.init()
    x, y = np.full(6, rank + 1.0, np.float32), np.empty(6, np.float32)
    for _ in range(3):
        assert pc.allreduce(x, out=y) is y and float(y[0]) == n * (n + 1) / 2
    model = _group(None).explain("allreduce", x.nbytes).split()[0]
    other = "ring" if model != "ring" else "halving_doubling"
    if rank == 0:
        _group(None)._world.comm.set_tuned([(KINDS["allreduce"], 1 << 20, other)])
    try:
        pc.allreduce(x, out=y)
        outcome = "ran"
    except CollectiveError as exc:
        outcome = "algorithm" if "algorithm" in str(exc) or other in str(exc) else str(exc)
    pc.shutdown()
    return outcome


@pytest.mark.timeout(60)
def test_remembered_call_chooses_again_when_auto_inputs_change():
    outcomes = run_ranks(_remembered_call_follows_a_new_tuned_table, 2, timeout=45)
    assert outcomes == ["algorithm", "algorithm"], outcomes


def _prepared_calls(rank, n):
    import pycollective as pc

    pc.init()
    results = []
    for algo in ("auto", "ring", "halving_doubling"):
        for count in (1, 5, 3001):
            x = np.zeros(count, np.float32)
            y = np.empty_like(x)
            plan = pc.prepare_allreduce(x, out=y, algo=algo)
            assert plan.algorithm in pc.algorithms()
            for step in range(3):
                # The same buffers, new contents each step: the plan reads them afresh.
                x[:] = np.arange(count, dtype=np.float32) * (rank + 1) + step
                assert plan() is y
                want = np.arange(count) * (n * (n + 1) / 2) + n * step
                np.testing.assert_allclose(y, want, rtol=1e-6)
            results.append(plan.algorithm)
    # In place and avg; a plain call in between keeps the sequence numbers in step.
    z = np.full(7, float(rank), np.float64)
    plan = pc.prepare_allreduce(z, op="avg", inplace=True)
    assert plan() is z and np.allclose(z, (n - 1) / 2)
    assert pc.allreduce(np.ones(3))[0] == n
    z[:] = 1.0
    assert np.allclose(plan(), 1.0)
    errors = []
    for bad in (
        lambda: pc.prepare_allreduce(np.ones(3, np.int32), op="avg"),
        lambda: pc.prepare_allreduce(np.ones(3), algo="no-such"),
        lambda: pc.prepare_allreduce(np.ones(3), out=np.ones(4)),
    ):
        try:
            bad()
            errors.append(None)
        except Exception as exc:
            errors.append(type(exc).__name__)
    # Every rank is past its own refusals before any starts the mismatched call: with ranks
    # sharing cores, two fast ranks' mismatch aborted the group while a slow one was still
    # preparing a refused call, which then said Aborted instead of ValueError.
    pc.barrier()
    # Ranks that prepared different calls fail together, naming what differed. A slow rank
    # may meet the abort already in prepare_allreduce (the group is aborted by then).
    try:
        plan = pc.prepare_allreduce(np.ones(4 + rank), algo="ring")
        plan()
        mismatch = "no error"
    except pc.CollectiveError as exc:
        mismatch = type(exc).__name__
    return results, errors, mismatch


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_prepared_allreduce(n):
    res = run_ranks(_prepared_calls, n, timeout=75)
    for algos, errors, mismatch in res:
        assert algos == res[0][0]  # every rank settled on the same algorithms
        assert errors == ["TypeError", "ValueError", "ValueError"], errors
        # The rank that saw the mismatch says what differed; the others learn it failed
        # (Aborted: the abort reached a rank before its own call started).
        assert mismatch in ("ProtocolError", "RemoteError", "Aborted"), mismatch
    assert "ProtocolError" in [r[2] for r in res]
