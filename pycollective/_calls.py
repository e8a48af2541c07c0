"""What one rank (or one replica) passes to a collective: the input as a contiguous buffer and
the output it gets back. Shared by LocalCommunicator and process groups, so both accept the
same tensors and shape their results the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective.tensors import Buffer, check_writable, contiguous_input

KINDS = {"allreduce": 0, "reduce_scatter": 1, "allgather": 2, "broadcast": 3, "reduce": 4}
REDUCING = {"allreduce", "reduce_scatter", "reduce"}


def chunk_bounds(count: int, parts: int, index: int) -> tuple[int, int]:
    """Element range [start, stop) of chunk `index` (csrc/algorithms/chunking.h's rule: the
    first count % parts chunks hold one extra element)."""
    base, extra = divmod(count, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass
class Prepared:
    """One rank's buffers for one call."""

    inp: np.ndarray
    out: np.ndarray | None  # None: this rank gets no result (reduce at a non-root)
    buf: Buffer

    @property
    def in_ptr(self) -> int:
        return self.inp.__array_interface__["data"][0]

    @property
    def out_ptr(self) -> int:
        return 0 if self.out is None else self.out.__array_interface__["data"][0]

    def result(self) -> Any:
        """The output in the caller's tensor type (the caller's own object when in place)."""
        if self.out is None:
            return None
        if self.out is self.buf.array:
            return self.buf.source
        return self.buf.wrap(self.out)


def prepare(kind: str, buf: Buffer, rank: int, size: int, root: int, inplace: bool,
            where: str) -> Prepared:
    """Checks one rank's tensor for `kind` and allocates its output."""
    if inplace:
        if kind in ("reduce_scatter", "allgather"):
            raise ValueError(f"{where}: {kind} returns an array of another size; inplace=True "
                             "is only for allreduce, broadcast and reduce")
        check_writable(buf, where)
    inp = contiguous_input(buf)
    shape = inp.shape
    if kind == "allreduce":
        out = inp if inplace else np.empty_like(inp)
    elif kind == "broadcast":
        out = inp if inplace else np.empty_like(inp)
    elif kind == "reduce":
        out = (inp if inplace else np.empty_like(inp)) if rank == root else None
    elif kind == "allgather":
        out = np.empty((size,) + shape, dtype=inp.dtype)
    elif kind == "reduce_scatter":
        start, stop = chunk_bounds(inp.size, size, rank)
        # Split along axis 0 when it divides evenly (then chunk r is rows of the input),
        # else flat chunks.
        if len(shape) >= 1 and shape[0] % size == 0 and inp.size > 0:
            out = np.empty((shape[0] // size,) + shape[1:], dtype=inp.dtype)
        else:
            out = np.empty(stop - start, dtype=inp.dtype)
    else:
        raise ValueError(f"unknown collective {kind!r}")
    return Prepared(inp, out, buf)
