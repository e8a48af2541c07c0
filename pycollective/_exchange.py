"""Buffers of the pairwise collectives (alltoall, gather, scatter, send/recv): what each rank
sends to and receives from every peer, as contiguous numpy views of the caller's tensors. The
native side (csrc/algorithms/pairwise.cc) moves each view straight to the peer's view: no
staging copy, whatever the counts."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._ext import _C
from pycollective.tensors import Buffer, adapt, check_writable, contiguous_input, written

# The pairwise collectives, with the extension's codes (the native name of "sendrecv" is
# "send/recv").
_NATIVE = _C.enum_codes()["collective_kind"]
KINDS = {name: _NATIVE[name] for name in ("alltoall", "gather", "scatter")}
KINDS["sendrecv"] = _NATIVE["send/recv"]


@dataclass(slots=True)
class Exchange:
    """One rank's side of a pairwise exchange: ``sends[p]``/``recvs[p]`` (array or None) per
    group rank, the element count every rank's frame header carries (the same on all ranks, 0
    where they legitimately differ), and how to hand back the result."""

    kind: str
    sends: list
    recvs: list
    count: int
    code: int
    shape_hash: int
    finish: Callable[[], Any]

    def result(self) -> Any:
        return self.finish()


def _inputs(x: Any, where: str) -> tuple[Buffer, np.ndarray]:
    buf = adapt(x, where)
    return buf, contiguous_input(buf)


def _output(x: Any, code: int, where: str) -> tuple[Buffer, np.ndarray]:
    buf = adapt(x, where)
    if buf.code != code:
        raise TypeError(
            f"{where}: the output has dtype {buf.dtype_name} but the input has "
            f"another dtype; pass tensors of one dtype"
        )
    check_writable(buf, where, inplace=False)
    return buf, buf.array


def _split(flat: np.ndarray, counts: Sequence[int], row: int) -> list[np.ndarray]:
    """Views of consecutive blocks of `counts[p]` rows (row = elements per row)."""
    views, start = [], 0
    for c in counts:
        views.append(flat[start : start + c * row])
        start += c * row
    return views


def _rows(name: str, counts: Sequence[int] | None, rows: int, size: int, where: str) -> list[int]:
    if counts is None:
        if rows % size:
            raise ValueError(
                f"{where}: alltoall splits axis 0 evenly, but {rows} rows do not "
                f"divide among {size} ranks; pass {name}"
            )
        return [rows // size] * size
    counts = [int(c) for c in counts]
    if len(counts) != size or min(counts, default=0) < 0 or sum(counts) != rows:
        raise ValueError(
            f"{where}: {name}={counts} must be {size} non-negative row counts "
            f"summing to the {rows} rows of axis 0"
        )
    return counts


def _same_dtype(bufs: list[Buffer], where: str) -> int:
    codes = {b.code for b in bufs}
    if len(codes) != 1:
        raise TypeError(
            f"{where}: every tensor of the call needs the same dtype, got "
            f"{sorted(b.dtype_name for b in bufs)}"
        )
    return codes.pop()


def alltoall(
    x: Any,
    out: Any,
    send_counts: Sequence[int] | None,
    recv_counts: Sequence[int] | None,
    size: int,
    where: str,
) -> Exchange:
    """Lists (x[p] to rank p, out[p] from rank p) or one array split along axis 0."""
    if isinstance(x, (list, tuple)):
        if len(x) != size:
            raise ValueError(
                f"{where}: alltoall takes {size} input tensors (one per rank), got {len(x)}"
            )
        ins = [_inputs(t, f"{where} input {p}") for p, t in enumerate(x)]
        code = _same_dtype([b for b, _ in ins], where)
        if out is None:  # each block comes back in the caller's tensor type
            arrays = [np.empty_like(a) for _, a in ins]
            out = [b.wrap(a) for (b, _), a in zip(ins, arrays)]
        elif not isinstance(out, (list, tuple)) or len(out) != size:
            raise ValueError(
                f"{where}: alltoall with a list of inputs takes a list of {size} outputs"
            )
        else:
            arrays = [_output(t, code, f"{where} output {p}")[1] for p, t in enumerate(out)]
        result = out
        return Exchange(
            "alltoall",
            [a.reshape(-1) for _, a in ins],
            [a.reshape(-1) for a in arrays],
            0,
            code,
            0,
            lambda: result,
        )
    buf, inp = _inputs(x, where)
    if inp.ndim == 0:
        raise ValueError(f"{where}: alltoall splits axis 0; got a 0-d tensor")
    row = int(np.prod(inp.shape[1:], dtype=np.int64))
    sends = _rows("send_counts", send_counts, inp.shape[0], size, where)
    if out is None:
        recv_rows = sum(recv_counts) if recv_counts is not None else inp.shape[0]
        out_buf = Buffer(
            np.empty((recv_rows,) + inp.shape[1:], inp.dtype), buf.code, buf.wrap, None
        )
        out_arr = out_buf.array
    else:
        out_buf, out_arr = _output(out, buf.code, f"{where} out=")
        if out_arr.ndim == 0 or int(np.prod(out_arr.shape[1:], dtype=np.int64)) != row:
            raise ValueError(
                f"{where}: out= has shape {out_arr.shape}; its rows must hold "
                f"{row} elements like the input's {inp.shape}"
            )
    recvs = _rows("recv_counts", recv_counts, out_arr.shape[0], size, where)
    even = send_counts is None and recv_counts is None
    return Exchange(
        "alltoall",
        _split(inp.reshape(-1), sends, row),
        _split(out_arr.reshape(-1), recvs, row),
        inp.size if even else 0,
        buf.code,
        0,
        _result(out_buf, out_arr),
    )


def _result(buf: Buffer, arr: np.ndarray) -> Callable[[], Any]:
    return (lambda: written(buf)) if buf.source is not None else (lambda: buf.wrap(arr))


def gather(x: Any, root: int, out: Any, rank: int, size: int, where: str) -> Exchange:
    """Every rank's x to the root: into out (a list of `size` tensors, or one tensor of shape
    (size, *x.shape), allocated when None); other ranks get None."""
    buf, inp = _inputs(x, where)
    sends: list = [None] * size
    recvs: list = [None] * size
    sends[root] = inp.reshape(-1)
    finish: Callable[[], Any] = lambda: None
    if rank == root:
        if out is None:
            arr = np.empty((size,) + inp.shape, inp.dtype)
            recvs = list(arr.reshape(size, -1))
            finish = lambda: buf.wrap(arr)
        elif isinstance(out, (list, tuple)):
            if len(out) != size:
                raise ValueError(
                    f"{where}: gather's root takes {size} output tensors, got {len(out)}"
                )
            recvs = [
                _output(t, buf.code, f"{where} output {p}")[1].reshape(-1)
                for p, t in enumerate(out)
            ]
            finish = lambda: out
        else:
            out_buf, arr = _output(out, buf.code, f"{where} out=")
            if arr.size != size * inp.size:
                raise ValueError(
                    f"{where}: out= holds {arr.size} elements; gather needs {size} x {inp.size}"
                )
            recvs = list(arr.reshape(size, -1))
            finish = _result(out_buf, arr)
    return Exchange("gather", sends, recvs, inp.size, buf.code, 0, finish)


def scatter(x: Any, root: int, out: Any, rank: int, size: int, where: str) -> Exchange:
    """The root's x[p] (a list of `size` tensors, or one tensor with axis 0 of length size) to
    rank p's out; x is ignored (may be None) on other ranks."""
    if out is None:
        raise ValueError(
            f"{where}: scatter writes into out=, which every rank must pass (the "
            "tensor that receives its chunk)"
        )
    probe = adapt(out, f"{where} out=")
    out_buf, out_arr = _output(out, probe.code, f"{where} out=")
    sends: list = [None] * size
    recvs: list = [None] * size
    recvs[root] = out_arr.reshape(-1)
    if rank == root:
        if x is None:
            raise ValueError(f"{where}: the root of scatter passes the chunks to send")
        if isinstance(x, (list, tuple)):
            if len(x) != size:
                raise ValueError(f"{where}: scatter's root takes {size} chunks, got {len(x)}")
            ins = [_inputs(t, f"{where} chunk {p}") for p, t in enumerate(x)]
            _same_dtype([b for b, _ in ins] + [out_buf], where)
            sends = [a.reshape(-1) for _, a in ins]
        else:
            buf, inp = _inputs(x, where)
            _same_dtype([buf, out_buf], where)
            if inp.ndim == 0 or inp.shape[0] != size:
                raise ValueError(
                    f"{where}: scatter's root passes axis 0 of length {size}, got shape {inp.shape}"
                )
            sends = list(inp.reshape(size, -1))
        for p, s in enumerate(sends):
            if s.size != out_arr.size:
                raise ValueError(
                    f"{where}: chunk {p} has {s.size} elements, out= holds {out_arr.size}"
                )
    return Exchange(
        "scatter", sends, recvs, out_arr.size, out_buf.code, 0, _result(out_buf, out_arr)
    )


def point_to_point(x: Any, sending: bool, tag: int, peer: int, where: str) -> Exchange:
    """send (x goes to the peer) or recv (x receives in place) in a group of two, where the
    peer is group rank `peer`. The tag travels in the frame header's shape field: a message
    under another tag or shape fails on arrival instead of landing in the wrong tensor."""
    if sending:
        buf, arr = _inputs(x, where)
    else:
        buf = adapt(x, where)
        _, arr = _output(x, buf.code, where)
    digest = zlib.crc32(repr((tuple(arr.shape), int(tag))).encode()) & 0xFFFFFFFF
    sends: list = [None, None]
    recvs: list = [None, None]
    (sends if sending else recvs)[peer] = arr.reshape(-1)
    return Exchange(
        "sendrecv",
        sends,
        recvs,
        arr.size,
        buf.code,
        digest,
        (lambda: None) if sending else _result(buf, arr),
    )
