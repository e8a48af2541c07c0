"""Allreduce plans on arrays the ranks of one host map (pycollective/shared_memory.py): results
against numpy for every dtype, op and size, in place and into new results; the fall back to the
ordinary plan where a rank's buffers are not shared; plans paired in different orders fail
instead of mixing buffers; freeing arrays under a live plan. Every case in separate processes
under a hard deadline."""

from __future__ import annotations

import ctypes
import gc
import os

import numpy as np
import pytest
from multiproc import expect_error, run_ranks
from reference import assert_close, make_inputs, reduce_ref


def test_shared_empty_is_a_plain_array_that_outlives_nothing():
    import pycollective as pc
    from pycollective import shared_memory

    x = pc.shared_empty((3, 5), np.float64)
    assert type(x) is np.ndarray and x.shape == (3, 5) and x.dtype == np.float64
    assert x.flags.writeable and x.flags.c_contiguous
    x[...] = 7
    assert shared_memory.holds(x) and shared_memory.holds(x[1:])
    assert not shared_memory.holds(np.ones(4))
    seg, _ = shared_memory._locate(x.ctypes.data, x.nbytes)
    assert len(_descriptors_of(seg.device, seg.inode)) == 2  # its own and the mmap object's
    view = x[2]
    del x
    gc.collect()
    assert shared_memory.holds(view) and (view == 7).all()  # a view keeps the memory
    del view
    gc.collect()
    assert _descriptors_of(seg.device, seg.inode) == []  # closed with the last view
    assert pc.shared_empty(0, np.int8).size == 0
    with pytest.raises(ValueError, match="plain dtype"):
        pc.shared_empty(3, object)


def _descriptors_of(device, inode):
    """This process's open descriptors of one file."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        if (st.st_dev, st.st_ino) == (device, inode):
            found.append(fd)
    return found


def _shared_descriptors():
    """This process's descriptors of shared arrays, its own and its peers'."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:pycollective-shared")
        except OSError:
            continue
    return count


def _plans_on_shared_arrays(rank, n):
    import pycollective as pc
    from pycollective import shared_memory

    pc.init()
    checks = 0
    for dtype in ("float32", "float64", "int32", "bfloat16"):
        for count in (1, 7, 5000, 300_001):
            for op in ("sum", "max", "avg") if dtype != "int32" else ("sum", "min"):
                xs = make_inputs(dtype, op, n, count, seed=count + n)
                x = pc.shared_empty(count, xs[rank].dtype)
                y = pc.shared_empty(count, xs[rank].dtype)
                plan = pc.prepare_allreduce(x, op=op, out=y, algo="direct")
                assert plan.algorithm == "direct (shared arrays)", plan.algorithm
                for round_ in range(3):  # the same buffers, new contents each time
                    x[...] = xs[rank] + round_
                    want = reduce_ref([v + round_ for v in xs], op)
                    assert plan() is y
                    assert_close(y, want, op, n, f"{dtype} {op} {count} round {round_}")
                    checks += 1
    # auto: above the host slots' 16 KiB, in place and into a new (shared) result.
    x = pc.shared_empty(1 << 16, np.float32)
    x[...] = rank + 1
    plan = pc.prepare_allreduce(x, inplace=True)
    assert plan.algorithm == "direct (shared arrays)" and plan() is x
    assert (x == n * (n + 1) / 2).all()
    x[...] = rank + 1
    plan = pc.prepare_allreduce(x)
    y = plan()
    assert shared_memory.holds(y) and (y == n * (n + 1) / 2).all()
    assert "shared" not in pc.prepare_allreduce(pc.shared_empty(16, np.float32)).algorithm
    # Every rank's result is the same to the bit (one rank reduces each chunk for everyone).
    xs = make_inputs("float32", "sum", n, 10_000, seed=3)
    x = pc.shared_empty(10_000, np.float32)
    x[...] = xs[rank]
    y = pc.prepare_allreduce(x, algo="direct")()
    gathered = pc.allgather(y, algo="ring")
    assert all(np.array_equal(gathered[i], gathered[0]) for i in range(n))
    # Plans on the same arrays share one mapping of each peer's (each holds a descriptor).
    x = pc.shared_empty(1 << 16, np.float32)
    x[...] = 1
    gc.collect()  # earlier plans' mappings go first, not while counting
    fds = _shared_descriptors()
    plans = [pc.prepare_allreduce(x, inplace=True, algo="direct") for _ in range(20)]
    assert _shared_descriptors() - fds == n - 1
    assert all(p.algorithm == "direct (shared arrays)" for p in plans)
    pc.barrier()
    pc.shutdown()
    return checks


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_plans_on_shared_arrays(n):
    results = run_ranks(_plans_on_shared_arrays, n, timeout=210)
    assert len(set(results)) == 1 and results[0] > 0


def _one_rank_not_shared(rank, n):
    import pycollective as pc

    pc.init()
    # Rank 0's input is a private array: every rank runs the ordinary plan, right all the same.
    x = np.full(100_000, rank + 1, np.float32) if rank == 0 else pc.shared_empty(100_000)
    x[...] = rank + 1
    plan = pc.prepare_allreduce(x, out=pc.shared_empty(100_000))
    y = plan()
    assert (y == n * (n + 1) / 2).all()
    # direct between processes needs shared arrays on every rank: refused with the reason.
    error = expect_error(lambda: pc.prepare_allreduce(np.ones(4), algo="direct"))
    assert error[0] == "ValueError" and "rank(s) [0, 1]" in error[1], error
    assert "pycollective.shared_empty" in error[1], error
    pc.barrier()
    pc.shutdown()
    return plan.algorithm


@pytest.mark.timeout(120)
def test_a_rank_without_shared_arrays_makes_every_rank_copy():
    algorithms = run_ranks(_one_rank_not_shared, 2, timeout=90)
    assert all("shared" not in a for a in algorithms), algorithms


def _plans_paired_across(rank, n):
    import pycollective as pc

    pc.init()
    a, b = pc.shared_empty(50_000), pc.shared_empty(50_000)
    a[...], b[...] = 1, 2
    # Rank 1 prepares them the other way round: its b pairs with rank 0's a.
    first, second = (a, b) if rank == 0 else (b, a)
    plan_first = pc.prepare_allreduce(first, inplace=True, algo="direct")
    plan_second = pc.prepare_allreduce(second, inplace=True, algo="direct")
    plan_a = plan_first if rank == 0 else plan_second
    error = expect_error(plan_a)  # both run "their a": paired with different plans
    pc.shutdown()
    return error


@pytest.mark.timeout(120)
def test_plans_paired_in_different_orders_fail_instead_of_mixing_buffers():
    errors = run_ranks(_plans_paired_across, 2, timeout=90)
    assert any(e[0] == "ProtocolError" and "different orders" in e[1] for e in errors), errors


def _freed_under_a_plan(rank, n):
    import pycollective as pc
    from pycollective import shared_memory

    pc.init()
    x = pc.shared_empty(1 << 18)
    x[...] = rank + 1
    plan = pc.prepare_allreduce(x, inplace=True, algo="direct")
    assert float(plan()[0]) == 3.0
    pc.barrier()
    if rank == 1:
        seg, _ = shared_memory._locate(x.ctypes.data, x.nbytes)
        del plan, x  # its own plan held x too: now nothing here does
        gc.collect()
        assert _descriptors_of(seg.device, seg.inode) == []  # freed on this side
    pc.barrier()
    seen = None
    if rank == 0:  # rank 1's array, through the mapping rank 0's plan still holds
        peer_input = plan._peers.inputs[1]
        seen = float(np.ctypeslib.as_array((ctypes.c_float * 4).from_address(peer_input))[0])
    pc.barrier()
    pc.shutdown()
    return seen


@pytest.mark.timeout(120)
def test_an_array_freed_under_a_live_plan_stays_mapped():
    assert run_ranks(_freed_under_a_plan, 2, timeout=90) == [3.0, None]
