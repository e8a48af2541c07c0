"""In-process suite: n replicas of a LocalCommunicator, every algorithm, a size sweep; numpy
(stack, sum, copy back) as the baseline, and the memory-traffic floor measured in the same run.
At each size the algorithms and numpy are timed against each other in interleaved rounds.

The floor of an allreduce over n in-process replicas of S bytes: every input read once and every
output written once, 2*n*S bytes, at the copy bandwidth of n threads (measured here, now)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .patterns import count_wrong, expected, np_dtype, out_buffer, poison, rank_input
from .rows import Row
from .timing import second_look, summarize, time_interleaved
from .worker import AUTO_NEW_OUTPUTS, AUTO_ROWS, how_auto_measures


def memory_floor_seconds(collective: str, n: int, nbytes: int, copy_bw: float) -> float:
    """Bytes the collective must read and write in total, at the machine's copy bandwidth."""
    traffic = {
        "allreduce": 2 * n * nbytes,
        "broadcast": (n + 1) * nbytes,
        "reduce": (n + 1) * nbytes,
        "allgather": n * nbytes + n * n * nbytes,
        "reduce_scatter": n * nbytes + nbytes,
    }[collective]
    return traffic / copy_bw


def run(
    collective: str,
    sizes: list[int],
    dtype: str,
    op: str,
    world: int,
    algos: list[str],
    iters: int,
    warmup: int,
    inplace: bool,
    copy_bw: float,
    progress: Callable[[str], None],
    budget_s: float = 2.0,
    new_outputs: bool = False,
) -> list[Row]:
    import pycollective as pc

    comm = pc.LocalCommunicator(world)
    # The auto+new row's own replicas: auto keeps a measured choice per group and call shape,
    # and a program makes its calls one way or the other, so each row's trial sees only its own.
    comm_of = {AUTO_NEW_OUTPUTS: pc.LocalCommunicator(world)} if AUTO_NEW_OUTPUTS in algos else {}
    itemsize = np_dtype(dtype).itemsize
    rows: list[Row] = []
    for nbytes in sizes:
        count = max(1, nbytes // itemsize)
        if collective == "allgather":
            count = max(1, count // world)
        inputs = [rank_input(r, count, dtype) for r in range(world)]
        outs = [out_buffer(collective, world, r, count, dtype) for r in range(world)]
        want = [expected(collective, op, world, count, dtype, r) for r in range(world)]
        row_bytes = count * itemsize * (world if collective == "allgather" else 1)
        calls, wrong = {}, {}
        for algo in algos:
            progress(f"inproc {collective} {algo} {row_bytes} B")
            _reset(inputs, outs, inplace, count, dtype)
            if algo == AUTO_NEW_OUTPUTS:
                if collective != "allreduce" or inplace:
                    progress(f"skip {algo}: it times allreduce into new arrays only")
                    continue
                call = _call(comm_of[algo], collective, inputs, None, "auto", op, inplace)
            else:
                outputs = None if new_outputs else outs
                call = _call(comm, collective, inputs, outputs, algo, op, inplace)
            try:
                results = call()  # the first call is checked, then timed calls follow
            except ValueError as exc:  # this algorithm cannot run this collective here
                progress(f"skip {algo}: {exc}")
                continue
            wrong[algo] = sum(count_wrong(results[r], want[r], op) for r in range(world))
            calls[algo] = call
            if algo in AUTO_ROWS:
                # Where auto measures (a near tie in the model, or a tuned entry to race), its
                # first calls of a shape are its trial of the candidates (a training loop's
                # first steps): timed from its settled choice on, as every algorithm after its
                # warm-up.
                for _ in range(comm_of.get(algo, comm).auto_trial_calls):
                    call()
        if collective == "allreduce":
            _reset(inputs, outs, inplace, count, dtype)
            calls["numpy"], wrong["numpy"] = _numpy_baseline(inputs, outs, want, op, world)
        samples = time_interleaved(calls, iters, warmup, budget_s)
        look = second_look(calls, samples, "auto", {"numpy", AUTO_NEW_OUTPUTS}, iters, budget_s)
        for algo, times in samples.items():
            t = summarize(times)
            peer = algo == "numpy"
            extra = (
                {}
                if peer
                else {"floor_s": memory_floor_seconds(collective, world, row_bytes, copy_bw)}
            )
            if algo in AUTO_ROWS:
                explained = comm_of.get(algo, comm).explain(collective, count * itemsize, dtype)
                extra["chose"] = explained.split()[0]
                extra["measures"] = how_auto_measures(explained)
                if look is not None and algo == "auto":
                    extra["second_look"] = look.as_dict()
            rows.append(
                Row(
                    collective,
                    row_bytes,
                    count,
                    dtype,
                    algo,
                    "inproc",
                    world,
                    t.median,
                    t.p10,
                    t.p90,
                    wrong[algo],
                    peer=peer,
                    extra=extra,
                )
            )
    return rows


def _reset(inputs: list, outs: list, inplace: bool, count: int, dtype: str) -> None:
    """Before a checked call: fresh inputs (an earlier in-place check left results there) and
    poisoned outputs (so that a result must really be written to pass)."""
    for r, x in enumerate(inputs):
        if inplace:
            x[...] = rank_input(r, count, dtype)
        else:
            poison(outs[r])


def _call(
    comm, collective: str, inputs: list, outs: list | None, algo: str, op: str, inplace: bool
) -> Callable[[], list]:
    """The timed call: into ``outs``, in place, or (outs None) into new result arrays."""
    if collective == "allreduce":
        if inplace:
            return lambda: comm.allreduce(inputs, op=op, algo=algo, inplace=True)
        return lambda: comm.allreduce(inputs, op=op, algo=algo, out=outs)
    if collective == "reduce_scatter":
        return lambda: comm.reduce_scatter(inputs, op=op, algo=algo, out=outs)
    if collective == "allgather":
        return lambda: comm.allgather(inputs, algo=algo, out=outs)
    if collective == "broadcast":
        return lambda: comm.broadcast(inputs, root=0, algo=algo, out=outs)
    if collective == "reduce":
        return lambda: comm.reduce(inputs, root=0, op=op, algo=algo, out=outs)
    raise ValueError(collective)


def _numpy_baseline(inputs, outs, want, op, world) -> tuple[Callable[[], list], int]:
    """What a user does without a library: stack, reduce, copy the result back to every replica.
    Returns the call and its number of wrong elements."""
    reducer = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "avg": np.mean}[op]

    def call():
        res = reducer(np.stack(inputs), axis=0).astype(inputs[0].dtype, copy=False)
        for o in outs:
            np.copyto(o, res)
        return outs

    results = call()
    return call, sum(count_wrong(results[r], want[r], op) for r in range(world))
