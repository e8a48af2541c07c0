"""Inputs whose reductions are exact in every dtype, so a result can be checked bit for bit
(nccl-tests checks the same way): small integers, different on every rank."""

from __future__ import annotations

import numpy as np

from pycollective.tensors import bf16_dtype


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        bf16 = bf16_dtype()  # imported on first use: most of a second per process
        if bf16 is None:
            raise SystemExit("bfloat16 needs ml_dtypes: pip install ml_dtypes")
        return bf16
    return np.dtype(name)


def rank_input(rank: int, count: int, dtype: str) -> np.ndarray:
    """Values in [-2, 2] (unsigned: [0, 4]); products of a few ranks stay exact."""
    idx = np.arange(count, dtype=np.int64)
    vals = (idx * 7 + rank * 3) % 5
    if np_dtype(dtype).kind != "u":
        vals = vals - 2
    return vals.astype(np_dtype(dtype))


def expected(
    collective: str, op: str, n: int, count: int, dtype: str, rank: int, root: int = 0
) -> np.ndarray | None:
    """What `rank` must hold after `collective` of rank_input() over n ranks."""
    if collective == "allgather":
        return np.stack([rank_input(r, count, dtype) for r in range(n)])
    if collective == "broadcast":
        return rank_input(root, count, dtype)
    # One rank's input at a time into one float64 accumulator (exact for these small integers):
    # a stack of every rank's input and every op's reduction took 6 GiB per rank at 4 ranks x
    # 256 MiB, and the kernel's OOM killer stopped the benchmark.
    combine = {
        "sum": np.add,
        "avg": np.add,
        "prod": np.multiply,
        "min": np.minimum,
        "max": np.maximum,
    }[op]
    red = rank_input(0, count, dtype).astype(np.float64)
    for r in range(1, n):
        combine(red, rank_input(r, count, dtype).astype(np.float64), out=red)
    if op == "avg":
        red /= n
    dt = np_dtype(dtype)
    if dt.kind in "iu":
        red = red.astype(np.int64).astype(dt)  # integer sums/products wrap like the kernels
    else:
        red = red.astype(dt)
    if collective == "reduce":
        return red if rank == root else None
    if collective == "reduce_scatter":
        base, extra = divmod(count, n)
        start = rank * base + min(rank, extra)
        return red[start : start + base + (1 if rank < extra else 0)]
    return red


def out_buffer(collective: str, n: int, rank: int, count: int, dtype: str) -> np.ndarray:
    """A preallocated result buffer (out=), shaped as pycollective shapes the result of
    rank_input() (a reduce's non-root ranks get one they will not use)."""
    from pycollective._calls import result_shape

    shape = result_shape(collective, (count,), count, rank, n, 0) or (count,)
    return np.empty(shape, np_dtype(dtype))


def poison(buf: np.ndarray | None) -> None:
    """Fills a result buffer with 0xFF bytes (NaN, or -1 for the small integers the inputs
    produce) before an algorithm's checked call: an algorithm that skips a write cannot pass
    on what the previous algorithm left in the shared buffer."""
    if buf is not None:
        buf.view(np.uint8).fill(0xFF)


def count_wrong(got, want: np.ndarray | None, op: str) -> int:
    """Elements that differ; avg is allowed one rounding of the final division."""
    if want is None:
        return 0
    g = np.asarray(got).reshape(-1)
    w = want.reshape(-1)
    if g.shape != w.shape:
        return max(g.size, w.size)
    if op == "avg":
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        return int((np.abs(gf - wf) > 1e-2 * np.maximum(1, np.abs(wf))).sum())
    return (
        int(
            (g.view(np.uint8).reshape(g.size, -1) != w.view(np.uint8).reshape(w.size, -1))
            .any(axis=1)
            .sum()
        )
        if g.size
        else 0
    )
