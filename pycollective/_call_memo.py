"""Calls a process group has checked before: a loop that calls ``allreduce(x, out=y)`` on small
numpy arrays skips adapting, checking and specifying them again on every call, which costs
several times the collective itself (about 5 us of Python against 1 us for the native call
with 2 ranks; with 4 ranks on 2 cores each rank's Python also waits for the core its peers
hold).

A call is remembered by its arguments and its arrays' layouts (shape, dtype, strides), not by
the arrays themselves: every check the full path makes follows from those (the dtype's native
code, contiguity, the result's shape, ``out=``'s dtype and shape), except that an array
written to must be writable, which is checked on every call. So fresh arrays of a known layout
hit too, an array reshaped or re-typed in place is another layout, and no array is kept alive.
The native call reads each array's data pointer itself every time. Only numpy arrays of at
most ``MAX_BYTES`` take this path: larger calls do not notice the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._calls import Prepared, new_output

#: largest input whose call is remembered
MAX_BYTES = 64 * 1024
#: layouts remembered per group; the oldest is dropped first
CAPACITY = 64


@dataclass(frozen=True, slots=True)
class Remembered:
    """One checked call layout: its native spec and what the call writes into."""

    spec: Any
    writes: str  # "out": the caller's out=; "inplace": x; "new": a new result; "none"
    result_shape: tuple[int, ...] | None  # for "new"
    dtype: np.dtype

    def buffers(self, x: np.ndarray, out: Any) -> tuple[Any, Any] | None:
        """(the array the native call writes, what the caller gets back), or None when an
        array to write is no longer writable (the full path then says so)."""
        if self.writes == "out":
            return (out, out) if out.flags.writeable else None
        if self.writes == "inplace":
            return (x, x) if x.flags.writeable else None
        if self.writes == "new":
            result = new_output(self.result_shape, self.dtype)  # type: ignore[arg-type]
            return result, result
        return None, None


class CallMemo:
    """Per group: a call's arguments and layouts -> Remembered. Safe without a lock: entries
    are immutable, and a lost entry is only checked anew."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple, Remembered] = {}

    @staticmethod
    def key(
        kind: str,
        x: Any,
        op: Any,
        algo: Any,
        root: Any,
        inplace: Any,
        out: Any,
        timeout: Any,
        compress: Any,
    ) -> tuple | None:
        """The memo's key for a call, or None when the call is not one it keeps."""
        if type(x) is not np.ndarray or x.nbytes > MAX_BYTES:
            return None
        if out is None:
            out_layout = None
        elif type(out) is np.ndarray:
            out_layout = (out.shape, out.dtype, out.strides)
        else:
            return None
        layout = (x.shape, x.dtype, x.strides)
        return (kind, layout, out_layout, op, algo, root, inplace, timeout, compress)

    def find(self, key: tuple) -> Remembered | None:
        try:
            return self._entries.get(key)
        except TypeError:  # an unhashable argument: the full path reports what is wrong
            return None

    def remember(
        self, key: tuple, x: np.ndarray, call: Prepared, out: Any, inplace: bool, spec: Any
    ) -> None:
        """Keeps a call that went through every check, when it runs on the caller's own arrays
        (a strided input is copied per call and is not kept)."""
        if call.inp is not x or (out is not None and call.out is not out):
            return
        if inplace:
            writes = "inplace"
        elif out is not None:
            writes = "out"
        else:
            writes = "none" if call.out is None else "new"
        entry = Remembered(
            spec=spec,
            writes=writes,
            result_shape=call.out.shape if writes == "new" else None,  # type: ignore[union-attr]
            dtype=x.dtype,
        )
        try:
            if len(self._entries) >= CAPACITY:  # drop the oldest (tolerating a concurrent drop)
                self._entries.pop(next(iter(self._entries), None), None)  # type: ignore[arg-type]
            self._entries[key] = entry
        except TypeError:  # an unhashable argument that the checks let through
            return
