"""What one rank (or one replica) passes to a collective: the input as a contiguous buffer and
the output it gets back. Shared by LocalCommunicator and process groups, so both accept the
same tensors and shape their results the same way."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._ext import _C
from pycollective.reduce_op import ReduceOp
from pycollective.tensors import DTYPE_NAMES, Buffer, check_writable, contiguous_input, written

# The collectives that run through one buffer per rank, with the extension's codes.
KINDS = {
    name: code
    for name, code in _C.enum_codes()["collective_kind"].items()
    if name in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier")
}
REDUCING = {"allreduce", "reduce_scatter", "reduce"}


@functools.lru_cache(maxsize=1024)
def call_spec(
    kind: int,
    count: int,
    dtype: int,
    op: int,
    root: int,
    algo: str,
    shape_hash: int,
    timeout: float,
    wire: int = 0,
) -> Any:
    """The native ``_C.CallSpec`` of a call. A training loop repeats the same few calls, and
    building one with keywords costs about 2 us, as much as a small collective's whole native
    path: the specs are kept, keyed by their fields (a spec is immutable)."""
    return _C.CallSpec(
        kind=kind,
        count=count,
        dtype=dtype,
        op=op,
        root=root,
        algo=algo,
        shape_hash=shape_hash,
        timeout=timeout,
        wire=wire,
    )


#: ``compress=`` values and their native wire-format codes (csrc/reduce/wire_codec.h).
WIRE_FORMATS: dict[str | None, int] = {None: 0, "bf16": 1, "fp16": 2}


def wire_code(compress: str | None, where: str) -> int:
    """The native wire format for ``compress=`` (None: values cross the network unchanged)."""
    try:
        return WIRE_FORMATS[compress]
    except (KeyError, TypeError):
        raise ValueError(
            f"{where}: compress must be None, 'bf16' or 'fp16', got {compress!r}"
        ) from None


#: Results at least this large get memory from the native output pool (core/output_pool.h).
POOLED_OUTPUT_BYTES: int = _C.POOLED_OUTPUT_BYTES


def new_output(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A result array (an ordinary numpy array the caller owns). From 1 MiB up its memory comes
    from the output pool: a released result's memory serves the next result of its size, so a
    loop of ``y = allreduce(x)`` stops paying the page faults of fresh memory (a 64 MiB result's
    cost as much as the collective)."""
    if math.prod(shape) * dtype.itemsize < POOLED_OUTPUT_BYTES:
        return np.empty(shape, dtype=dtype)  # the common small case without a native call
    return _C.new_result(dtype, list(shape))


def chunk_bounds(count: int, parts: int, index: int) -> tuple[int, int]:
    """Element range [start, stop) of chunk `index` (csrc/algorithms/chunking.h's rule: the
    first count % parts chunks hold one extra element)."""
    base, extra = divmod(count, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(slots=True)
class Prepared:
    """One rank's buffers for one call."""

    inp: np.ndarray
    out: np.ndarray | None  # None: this rank gets no result (reduce at a non-root)
    buf: Buffer

    def result(self) -> Any:
        """The output in the caller's tensor type (the caller's own object when in place)."""
        if self.out is None:
            return None
        if self.out is self.buf.array:
            return written(self.buf)
        return self.buf.wrap(self.out)


def result_shape(
    kind: str, shape: tuple[int, ...], count: int, rank: int, size: int, root: int
) -> tuple[int, ...] | None:
    """Shape of `kind`'s result on `rank` (None: no result there, i.e. reduce off the root)."""
    if kind in ("allreduce", "broadcast"):
        return shape
    if kind == "reduce":
        return shape if rank == root else None
    if kind == "allgather":
        return (size,) + shape
    if kind == "reduce_scatter":
        # Rows of axis 0 when it divides evenly (chunk r is then rows of the input), else flat.
        if len(shape) >= 1 and shape[0] % size == 0:
            return (shape[0] // size,) + shape[1:]
        start, stop = chunk_bounds(count, size, rank)
        return (stop - start,)
    raise ValueError(f"unknown collective {kind!r}")


def check_avg(kind: str, op: ReduceOp, code: int, where: str) -> None:
    """avg of an integer dtype (native code >= 4) is refused before anything moves."""
    if code >= 4 and op is ReduceOp.AVG and kind in REDUCING:
        raise TypeError(
            f"{where}: avg is not defined for {DTYPE_NAMES[code]}: use op='sum' "
            "and divide, or convert to a floating dtype"
        )


def check_inplace_call(kind: str, out: Any, where: str) -> None:
    """inplace=True is refused with out= and for collectives whose result has another size."""
    if out is not None:
        raise ValueError(f"{where}: pass either inplace=True or out=, not both")
    if kind in ("reduce_scatter", "allgather"):
        raise ValueError(
            f"{where}: {kind} returns an array of another size; inplace=True "
            "is only for allreduce, broadcast and reduce"
        )


def prepare(
    kind: str,
    buf: Buffer,
    rank: int,
    size: int,
    root: int,
    inplace: bool,
    where: str,
    out: Buffer | None = None,
) -> Prepared:
    """Checks one rank's tensor for `kind` and allocates its output, or checks the caller's
    ``out`` buffer (same dtype, the result's shape, writable and contiguous)."""
    if inplace:
        check_inplace_call(kind, out, where)
        check_writable(buf, where)
    inp = contiguous_input(buf)
    shape = result_shape(kind, inp.shape, inp.size, rank, size, root)
    if shape is None:
        return Prepared(inp, None, buf)
    if inplace:
        return Prepared(inp, inp, buf)
    if out is None:
        return Prepared(inp, new_output(shape, inp.dtype), buf)
    if out.code != buf.code:
        raise TypeError(
            f"{where}: out= has dtype {out.dtype_name} but the input has {buf.dtype_name}"
        )
    if out.array.shape != shape:
        raise ValueError(
            f"{where}: out= has shape {out.array.shape}; the result of {kind} has shape {shape}"
        )
    check_writable(out, f"{where} (out=)", inplace=False)
    return Prepared(inp, out.array, out)
