"""The host segment and the algorithms that run through it (csrc/transport/host_segment.h):
`slots` (csrc/algorithms/slots.cc), small collectives of one host's ranks in one call, and
`staged` (csrc/algorithms/staged.cc), large allreduces, reduce-scatters and allgathers piece by
piece.
Results against numpy, mismatched calls, timeouts, aborting peers, subgroups, and the settings
that turn it off -- every case in separate processes under a hard deadline. (A peer that dies
on the segment: tests/test_failures.py.)"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest
from multiproc import expect_error, run_ranks
from reference import assert_close, make_inputs, reduce_ref

SLOT_BYTES = 16 << 10  # PYCOLLECTIVE_HOST_SLOT_BYTES: the largest call slots runs
# PYCOLLECTIVE_HOST_PIECE_BYTES unset: the segment's slots hold a piece of this many bytes a rank
PIECE_BYTES = {2: 1 << 20, 3: 512 << 10, 4: 512 << 10}


def _segment():
    from pycollective import process_group

    return process_group._default()._world.comm.host_segment


def _allreduce_checks(pc, algo, rank, n, dtype, count, ops):
    """allreduce with `algo` against numpy for each op, then in place to the same bits."""
    for op in ops:
        xs = make_inputs(dtype, op, n, count, seed=count + n)
        y = pc.allreduce(xs[rank], op=op, algo=algo)
        assert_close(y, reduce_ref(xs, op), op, n, f"{algo} {dtype} {op} {count}")
        z = xs[rank].copy()
        pc.allreduce(z, op=op, algo=algo, inplace=True)
        assert np.asarray(z).tobytes() == np.asarray(y).tobytes()
    return 2 * len(ops)


def _every_collective(rank, n):
    import pycollective as pc

    pc.init()
    name, ranks, slot_bytes = _segment()
    assert ranks == list(range(n)) and slot_bytes == PIECE_BYTES[n]
    assert not any(name[1:] in f for f in os.listdir("/dev/shm")), "the name outlived init"
    checks = 0
    for dtype, itemsize in (("float32", 4), ("float64", 8), ("int32", 4), ("bfloat16", 2)):
        for count in (0, 1, 7, 1000, SLOT_BYTES // itemsize):
            # In place: the input is copied into the slot before anything is written.
            ops = ("sum", "max", "avg") if dtype != "int32" else ("sum", "min")
            checks += _allreduce_checks(pc, "slots", rank, n, dtype, count, ops)
            xs = make_inputs(dtype, "sum", n, count, seed=count)
            g = pc.allgather(xs[rank], algo="slots")
            assert np.asarray(g).tobytes() == np.stack(xs).tobytes()
            root = count % n
            b = pc.broadcast(xs[rank], root=root, algo="slots")
            assert np.asarray(b).tobytes() == xs[root].tobytes()
            red = pc.reduce(xs[rank], root=root, algo="slots")
            if rank == root:
                assert_close(red, reduce_ref(xs, "sum"), "sum", n, "reduce")
            else:
                assert red is None
            part = pc.reduce_scatter(xs[rank], algo="slots")
            base, extra = divmod(count, n)
            start = rank * base + min(rank, extra)
            full = reduce_ref(xs, "sum").reshape(-1)
            assert_close(
                np.asarray(part).reshape(-1),
                full[start : start + base + (rank < extra)],
                "sum",
                n,
                "reduce_scatter",
            )
            checks += 4
    # Every rank's result is the same to the bit (rank-order reduction on every rank).
    x = make_inputs("float32", "sum", n, 1000, seed=5)[rank]
    digest = np.frombuffer(pc.allreduce(x, algo="slots").tobytes(), np.uint8).astype(np.int64)
    gathered = pc.allgather(digest, algo="ring")
    assert all((gathered[i] == gathered[0]).all() for i in range(n))
    # Many calls back to back alternate the two slots: results stay right across the reuse.
    y = np.empty(3, np.float32)
    plan = pc.prepare_allreduce(np.full(3, rank + 1, np.float32), out=y)
    for _ in range(2000):
        plan()
        assert y[0] == n * (n + 1) / 2
    pc.barrier()
    pc.shutdown()
    return checks


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_slots_run_every_collective(n):
    results = run_ranks(_every_collective, n, timeout=150)
    assert len(set(results)) == 1 and results[0] > 0


def _staged(rank, n):
    import pycollective as pc

    pc.init()
    # Slots of 4 KiB (the settings below): pieces of a little under n / (n + 1) of a slot, so
    # these counts cover less than a share, part of a piece, about one and a part after many.
    _, _, slot_bytes = _segment()
    assert slot_bytes == 4096
    checks = 0
    for dtype, itemsize in (("float32", 4), ("float64", 8), ("int32", 4), ("bfloat16", 2)):
        piece = (4096 // itemsize) * n // (n + 1)
        for count in (0, 1, n - 1, 7, 1000, piece, 3 * piece, 20_000 + n):
            # In place: a piece's result is written only after the piece was staged, and this
            # rank's own share is read from its input before that.
            ops = ("sum", "max", "avg", "prod") if dtype != "int32" else ("sum", "min")
            checks += _allreduce_checks(pc, "staged", rank, n, dtype, count, ops)
    # Every rank's result is the same to the bit (shares reduced in rank order, then copied).
    x = make_inputs("float32", "sum", n, 30_001, seed=7)[rank]
    digest = np.frombuffer(pc.allreduce(x, algo="staged").tobytes(), np.uint8).astype(np.int64)
    gathered = pc.allgather(digest, algo="ring")
    assert all((gathered[i] == gathered[0]).all() for i in range(n))
    # Calls back to back, alternating with slots' small calls on the same segment slots.
    y = np.empty(5000, np.float32)
    plan = pc.prepare_allreduce(np.full(5000, rank + 1, np.float32), out=y, algo="staged")
    for i in range(200):
        plan()
        assert (y == n * (n + 1) / 2).all()
        if i % 7 == 0:
            assert pc.allreduce(np.ones(3, np.float32), algo="slots")[0] == n
    others = expect_error(lambda: pc.broadcast(np.ones(3, np.float32), algo="staged"))
    pc.barrier()
    pc.shutdown()
    return checks, others


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_staged_allreduce_matches_numpy_across_pieces(n):
    env = {"PYCOLLECTIVE_HOST_PIECE_BYTES": "4096", "PYCOLLECTIVE_HOST_SLOT_BYTES": "4096"}
    results = run_ranks(_staged, n, timeout=150, env=env)
    assert len({checks for checks, _ in results}) == 1 and results[0][0] > 0
    for _, (name, msg, _) in results:
        assert name == "ValueError" and "reduce_scatter and allgather only" in msg, msg


def _staged_far_apart(rank, n):
    """staged with every rank finding the others' cores far: what the others read goes past
    the cache (the pieces, the reduced shares, the reads' outputs, reduce-scatter's parts)."""
    import pycollective as pc
    from pycollective import process_group

    pc.init()
    comm = process_group._default()._world.comm
    comm.fix_host_segment_distance(300)  # a cache line across chiplets (EPYC VM: 310-345 ns)
    pc.barrier()  # over links: every rank voted before the first staged call
    assert comm.host_segment_streams is True
    checks = 0
    # Default pieces (1 MiB a slot with 2 ranks, 512 KiB with 3): less than one, one and a
    # part, several; with 2 ranks the reads' window unless PYCOLLECTIVE_CROSS_MEMORY=0.
    for dtype in ("float32", "int32", "bfloat16"):
        ops = ("sum", "max", "avg") if dtype != "int32" else ("sum", "min")
        for count in (1000, 70_001, 600_001):
            checks += _allreduce_checks(pc, "staged", rank, n, dtype, count, ops)
            xs = make_inputs(dtype, "sum", n, count, seed=count + 3)
            base, extra = divmod(count, n)
            start = rank * base + min(rank, extra)
            share = reduce_ref(xs, "sum")[start : start + base + (rank < extra)]
            y = pc.reduce_scatter(xs[rank], algo="staged")
            assert_close(y, share, "sum", n, f"far reduce_scatter {dtype} {count}")
            g = pc.allgather(xs[rank], algo="staged")
            assert np.asarray(g).tobytes() == np.stack(xs).tobytes(), (dtype, count)
            checks += 2
    assert comm.host_segment_streams is True
    pc.barrier()
    pc.shutdown()
    return checks


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n,cross_memory", [(2, "1"), (2, "0"), (3, "1")])
def test_staged_matches_numpy_with_the_cores_far_apart(n, cross_memory):
    env = {"PYCOLLECTIVE_CROSS_MEMORY": cross_memory}
    results = run_ranks(_staged_far_apart, n, timeout=150, env=env)
    assert len(set(results)) == 1 and results[0] > 0


def _staged_shares(rank, n):
    import pycollective as pc

    pc.init()
    assert _segment()[2] == 4096
    checks = 0
    for dtype, itemsize in (("float32", 4), ("float64", 8), ("int32", 4), ("bfloat16", 2)):
        part = 4096 // n // 64 * 64 // itemsize  # reduce_scatter's part of a share per call
        # Less than a share each, shares of one part and of a little more, many parts, and
        # counts that n does not divide (the first ranks' shares one element longer).
        for count in (0, 1, n - 1, 7, n * part, n * part + 1, 3 * n * part - 1, 20_000 + n):
            ops = ("sum", "max", "avg") if dtype != "int32" else ("sum", "min")
            for op in ops:
                xs = make_inputs(dtype, op, n, count, seed=count + n)
                ref = reduce_ref(xs, op)
                base, extra = divmod(count, n)
                start = rank * base + min(rank, extra)
                share = ref[start : start + base + (rank < extra)]
                y = pc.reduce_scatter(xs[rank], op=op, algo="staged")
                assert_close(y, share, op, n, f"reduce_scatter {dtype} {op} {count}")
                checks += 1
            x = make_inputs(dtype, "sum", n, count, seed=count)
            out = np.full((n, count), 7, x[rank].dtype)  # every rank's input in a row
            got = pc.allgather(x[rank], algo="staged", out=out)
            assert np.array_equal(np.asarray(got).reshape(-1), np.concatenate(x)), (dtype, count)
            # An allreduce between them: the slots it writes are the next calls' to write.
            assert pc.allreduce(np.ones(3, np.float32), algo="staged")[0] == n
            checks += 1
    pc.barrier()
    pc.shutdown()
    return checks


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_staged_reduce_scatter_and_allgather_match_numpy_across_pieces(n):
    env = {"PYCOLLECTIVE_HOST_PIECE_BYTES": "4096", "PYCOLLECTIVE_HOST_SLOT_BYTES": "4096"}
    results = run_ranks(_staged_shares, n, timeout=150, env=env)
    assert len(set(results)) == 1 and results[0] > 0


def _by_reads(rank, n):
    import pycollective as pc
    from pycollective import process_group

    pc.init()
    comm = process_group._default()._world.comm
    agreed = comm.host_segment_reads_peers  # at init, when the segment was connected

    def calls_of(call):
        before = comm.host_segment_calls
        result = call()
        return result, comm.host_segment_calls - before

    gather_calls = []
    # 4 KB a rank (one piece, never read), 4 MiB a rank twice (8 pieces of 512 KiB, or read).
    for count in (1000, 1 << 20, 1 << 20):
        x = make_inputs("float32", "sum", n, count, seed=count + 1)
        got, calls = calls_of(lambda: pc.allgather(x[rank], algo="staged"))
        gather_calls.append(calls)
        assert np.array_equal(np.asarray(got).reshape(-1), np.concatenate(x)), count
    scatter_calls = []
    # 64 KiB a rank (one piece, never read), 256 KiB (one piece, or read: the window's first
    # size), 4 MiB (shares of 2 MiB in parts of 256 KiB, or read).
    for count in (1 << 14, 1 << 16, 1 << 20):
        for op in ("sum", "max"):
            xs = make_inputs("float32", op, n, count, seed=count)
            got, calls = calls_of(lambda: pc.reduce_scatter(xs[rank], op=op, algo="staged"))
            scatter_calls.append(calls)
            share = np.split(reduce_ref(xs, op), n)[rank]
            assert_close(got, share, op, n, f"reduce_scatter {op} {count}")
    reduce_calls = []
    # 128 KiB a rank (one piece, never read), 256 KiB (one piece, or read: the window's first
    # size), 2 and 4 MiB (pieces of 341 KiB, or read).
    for count in (1 << 15, 1 << 16, 1 << 19, 1 << 20):
        xs = make_inputs("float32", "sum", n, count, seed=count)
        got, calls = calls_of(lambda: pc.allreduce(xs[rank], algo="staged"))
        reduce_calls.append(calls)
        assert_close(got, reduce_ref(xs, "sum"), "sum", n, f"allreduce {count}")
    # Every dtype and op, out of place and in place, shares of unequal length (odd counts): the
    # reads' results are the pieces' to the bit (both reduce in rank order).
    checks = 0
    for dtype in ("float32", "float64", "int32", "bfloat16"):
        ops = ("sum", "max", "avg", "prod") if dtype != "int32" else ("sum", "min")
        for count in (70_001, 600_001):
            checks += _allreduce_checks(pc, "staged", rank, n, dtype, count, ops)
    pc.barrier()
    pc.shutdown()
    return agreed, gather_calls, scatter_calls, reduce_calls, checks


_HOLDER = """
import ctypes, os, sys
if os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):  # as a rank does: PR_SET_PTRACER_ANY
    ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)
word = ctypes.c_uint64(0x5043434D41)
print(ctypes.addressof(word), flush=True)
sys.stdin.read()
"""

_READER = """
import ctypes, sys
pid, address = int(sys.argv[1]), int(sys.argv[2])

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

got = ctypes.c_uint64(0)
local, remote = IoVec(ctypes.addressof(got), 8), IoVec(address, 8)
libc = ctypes.CDLL(None, use_errno=True)
n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print(n == 8 and got.value == 0x5043434D41)
"""


def _siblings_read_each_other() -> bool:
    """Whether this machine lets one process read a sibling's memory (Yama, seccomp and
    capabilities decide), found out as the ranks would: two children of this process, the read
    one letting its user's processes trace it where Yama restricts that."""
    import subprocess

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        address = holder.stdout.readline().strip()
        reader = subprocess.run(
            [sys.executable, "-c", _READER, str(holder.pid), address],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return reader.stdout.strip() == "True"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("cross_memory", ["1", "0", "mixed"])
def test_two_ranks_read_each_others_buffers(cross_memory):
    """2 ranks: allgathers of 16 KiB-16 MiB a rank, reduce-scatters from 256 KiB and allreduces of
    256 KiB-16 MiB read the other rank's buffers (process_vm_readv): two, two and three segment
    calls whatever the size, where the members agreed, in two calls when they connected the
    segment, that they can. With PYCOLLECTIVE_CROSS_MEMORY=0 on either rank they agree that they
    cannot, and the calls go through the segment in pieces. The
    results match numpy either way."""
    per_rank = [
        {
            "PYCOLLECTIVE_CROSS_MEMORY": "0"
            if cross_memory == "0" or (cross_memory, r) == ("mixed", 1)
            else "1",
            # The pieces the calls are counted in (2 ranks' default is 1 MiB).
            "PYCOLLECTIVE_HOST_PIECE_BYTES": str(512 << 10),
        }
        for r in range(2)
    ]
    results = run_ranks(_by_reads, 2, timeout=120, per_rank_env=per_rank)
    # Where the machine refuses (Yama's ptrace_scope, a seccomp filter), the ranks must agree so.
    reads = cross_memory == "1" and _siblings_read_each_other()
    assert len({checks for *_, checks in results}) == 1
    for agreed, gather_calls, scatter_calls, reduce_calls, _ in results:
        assert agreed is reads, (cross_memory, agreed)
        # Two calls an allgather by reads, or one a piece.
        assert gather_calls == ([1, 2, 2] if reads else [1, 8, 8]), gather_calls
        if reads:
            assert scatter_calls == [1, 1, 2, 2, 2, 2], scatter_calls
            assert reduce_calls == [2, 3, 3, 3], reduce_calls
        else:
            assert scatter_calls == [1, 1, 1, 1, 8, 8], scatter_calls
            assert reduce_calls[:2] == [2, 2] and 3 < reduce_calls[2] < reduce_calls[3], (
                reduce_calls
            )


def _hierarchical(rank, n):
    import pycollective as pc
    from pycollective import process_group

    pc.init()
    comm = process_group._default()._world.comm
    checks, segment_calls = 0, []
    for dtype in ("float32", "float64", "int32"):
        # 600 003: a reduce-scatter and an allgather of two ranks that read each other's input
        # (in place).
        for count in (0, 1, 5, 1000, 20_000 + n, 600_003):
            op = "sum" if dtype != "int32" else "max"
            xs = make_inputs(dtype, op, n, count, seed=count)
            before = comm.host_segment_calls
            y = pc.allreduce(xs[rank], op=op, algo="hierarchical")
            assert_close(y, reduce_ref(xs, op), op, n, f"hierarchical {dtype} {count}")
            # In place: the host's reduce-scatter writes this rank's share over its own input.
            z = xs[rank].copy()
            pc.allreduce(z, op=op, algo="hierarchical", out=z)
            assert_close(z, reduce_ref(xs, op), op, n, f"in place {dtype} {count}")
            segment_calls.append(comm.host_segment_calls - before)
            checks += 1
    pc.barrier()
    pc.shutdown()
    return checks, segment_calls


@pytest.mark.timeout(180)
@pytest.mark.parametrize("per_host", [2, 3])
@pytest.mark.parametrize("segment", ["1", "0"])
def test_hierarchical_runs_each_hosts_phases_through_its_segment(per_host, segment):
    """Two pretend hosts: the reduce-scatter and allgather inside each run through its host
    segment (staged's, in pieces of 4 KiB), the ring between hosts over tcp; with
    PYCOLLECTIVE_HOST_SEGMENT=0 around rings of shm links, to the same results."""
    n = 2 * per_host
    env = {"PYCOLLECTIVE_HOST_PIECE_BYTES": "4096", "PYCOLLECTIVE_HOST_SEGMENT": segment}
    hosts = [{"PYCOLLECTIVE_HOST_ID": "ab"[r // per_host]} for r in range(n)]
    results = run_ranks(_hierarchical, n, timeout=150, env=env, per_rank_env=hosts)
    assert len({checks for checks, _ in results}) == 1
    for _, calls in results:
        if segment == "0":
            assert set(calls) == {0}, calls
        else:  # two pieces' calls at least per phase; many for 20 000 elements
            assert min(calls) >= 2 and max(calls) > 20, calls


def _auto_and_limits(rank, n):
    import pycollective as pc

    pc.init()
    g = pc.process_group._default()
    small, large = g.explain("allreduce", 64), g.explain("allreduce", 4 << 20)
    plan = pc.prepare_allreduce(np.ones(16, np.float32), out=np.empty(16, np.float32))
    too_big = expect_error(
        lambda: pc.allreduce(np.ones(SLOT_BYTES // 4 + 1, np.float32), algo="slots")
    )
    # A subgroup is not the segment's members: slots cannot run it, auto picks links.
    sub = pc.new_group([0, 1])
    sub_result = sub_error = None
    if sub is not None:
        sub_result = float(pc.allreduce(np.ones(4, np.float32), group=sub)[0])
        sub_error = expect_error(
            lambda: pc.allreduce(np.ones(4, np.float32), algo="slots", group=sub)
        )
    pc.barrier()
    pc.shutdown()
    return [small, large, plan.algorithm, too_big, sub_result, sub_error]


@pytest.mark.timeout(90)
def test_auto_chooses_slots_for_small_calls_only():
    for rank, (small, large, planned, too_big, sub_result, sub_error) in enumerate(
        run_ranks(_auto_and_limits, 3, timeout=60)
    ):
        assert small.startswith("slots"), small
        assert not large.startswith("slots") and "slots=n/a" in large, large
        assert "staged=" in large and "staged=n/a" not in large, large
        assert planned == "slots"
        assert too_big[0] == "ValueError" and "calls of up to 16384 bytes" in too_big[1], too_big
        if rank < 2:
            assert sub_result == 2.0
            assert sub_error[0] == "ValueError" and "not on a subgroup" in sub_error[1], sub_error
        else:
            assert sub_result is None


def _no_segment(rank, n):
    import pycollective as pc

    pc.init()
    seg = _segment()
    err = expect_error(lambda: pc.allreduce(np.ones(2, np.float32), algo="slots"))
    y = pc.allreduce(np.ones(2, np.float32))  # auto still works, over links
    pc.barrier()
    pc.shutdown()
    return [seg, err, float(y[0])]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "env", [{"PYCOLLECTIVE_HOST_SEGMENT": "0"}, {"PYCOLLECTIVE_TRANSPORT": "tcp"}]
)
def test_no_segment_when_turned_off_or_links_forced_to_tcp(env):
    for seg, err, y in run_ranks(_no_segment, 2, timeout=60, env=env):
        assert seg is None
        assert err[0] == "ValueError" and "no host segment" in err[1], err
        assert y == 2.0


def _mismatch(rank, n, other_count, algo, other_algo):
    import pycollective as pc

    pc.init(timeout=20)
    count, algo = (10, algo) if rank == 1 else (other_count, other_algo)
    res = expect_error(lambda: pc.allreduce(np.ones(count, np.float32), algo=algo))
    pc.shutdown(timeout=5)
    return res


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "other_count, algo, other_algo, says",
    [
        # Both calls on the segment: each rank checks the others' headers.
        (12, "slots", "slots", "element count: here 10, peer 12"),
        (100_000, "auto", "auto", "element count: here 10, peer 100000"),  # slots and staged
        (100_000, "slots", "staged", "element count: here 10, peer 100000"),
        # Rank 1's call runs on the segment, the others' over links: still found fast, through
        # the link call's notice in the segment.
        (100_000, "slots", "ring", "over links: "),
        (100_000, "staged", "halving_doubling", "over links: "),
    ],
)
def test_mismatched_calls_fail_fast_naming_both(other_count, algo, other_algo, says):
    res = run_ranks(_mismatch, 3, other_count, algo, other_algo, timeout=60)
    # Rank 1 differs; nobody waits out the timeout.
    for name, msg, seconds in res:
        assert name in ("ProtocolError", "RemoteError", "Aborted"), (name, msg)
        assert seconds < 10, (name, msg, seconds)
    assert res[1][0] == "ProtocolError", res[1]
    assert says in res[1][1] and f"element count: here 10, peer {other_count}" in res[1][1], res


def _timeout(rank, n, algo, count):
    import pycollective as pc

    pc.init()
    if rank == 0:
        x = np.ones(count, np.float32)
        res = expect_error(lambda: pc.allreduce(x, algo=algo, timeout=1.0))
    else:
        time.sleep(3)  # never calls the collective
        res = None
    return res


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algo, count", [("slots", 4), ("staged", 1 << 20)])
def test_timeout_names_rank_call_and_segment(algo, count):
    name, msg, seconds = run_ranks(_timeout, 2, algo, count, timeout=40)[0]
    assert name == "CollectiveTimeout", msg
    assert f"[rank 0/2] allreduce#0 ({algo}, float32, {count} elems" in msg, msg
    assert "waiting for rank 1 on the host segment" in msg and "PYCOLLECTIVE_TIMEOUT" in msg, msg
    assert seconds < 5


def _aborts(rank, n):
    import pycollective as pc

    pc.init(timeout=30)
    pc.barrier()
    if rank == 0:
        time.sleep(0.3)
        pc.process_group._default()._world.comm.abort("rank 0 gave up on purpose")
        return None
    return expect_error(lambda: pc.allreduce(np.ones(4, np.float32), algo="slots"))


@pytest.mark.timeout(60)
def test_an_abort_reaches_ranks_waiting_on_the_segment():
    res = run_ranks(_aborts, 3, timeout=40)
    for r in (1, 2):
        name, msg, seconds = res[r]
        assert name in ("RemoteError", "Aborted"), res[r]
        assert "gave up on purpose" in msg, msg
        assert seconds < 5.0
