"""The last few small calls of a process group, already checked: a loop that calls
``allreduce(x, out=y)`` on the same numpy arrays skips adapting, checking and specifying them
again on every call, which costs several times the collective itself at small sizes (about 5 us
of Python against 1 us for the native call with 2 ranks; with 4 ranks on 2 cores each rank's
Python waits for the core its peers hold).

An entry is used only while the arrays are the same objects with the same shape, dtype and
strides (an array written to must also still be writable), so an array reshaped, re-typed or re-strided
in place since is checked anew. The native call reads each array's data pointer itself every
time. Only arrays of at most ``MAX_BYTES`` are remembered: the memo keeps them alive, and
larger calls do not notice the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._calls import Prepared, new_output

#: largest array (input or output) whose call is remembered
MAX_BYTES = 64 * 1024
#: calls remembered per group; the oldest is dropped first
CAPACITY = 8


@dataclass(slots=True)
class Remembered:
    """One checked call: its arrays, what they looked like, and its native spec."""

    x: np.ndarray
    out: np.ndarray | None  # the caller's out= array (None: a new result, or none at all)
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...]
    out_layout: tuple | None  # the out= array's (shape, dtype, strides)
    result_shape: tuple[int, ...] | None  # a new result's shape (None: out=, in place or none)
    inplace: bool
    spec: Any

    def still_holds(self, x: np.ndarray, out: Any) -> bool:
        # `is` for dtypes: numpy's built-in dtypes are single objects, and a false "changed"
        # only sends the call down the full path.
        if x.dtype is not self.dtype or x.shape != self.shape or x.strides != self.strides:
            return False
        if out is None:
            return not self.inplace or x.flags.writeable
        shape, dtype, strides = self.out_layout  # type: ignore[misc]
        return (
            out.dtype is dtype
            and out.shape == shape
            and out.strides == strides
            and out.flags.writeable
        )

    def buffers(self) -> tuple[np.ndarray | None, Any]:
        """(the output the native call writes, what the caller gets back)."""
        if self.inplace:
            return self.x, self.x
        if self.out is not None:
            return self.out, self.out
        if self.result_shape is None:
            return None, None
        result = new_output(self.result_shape, self.dtype)
        return result, result


class CallMemo:
    """Per group: call arguments -> Remembered. Not thread-safe by design: a group's calls are
    issued in one order by every rank, and the memo only saves work (a lost entry is checked
    anew)."""

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
        if out is not None and type(out) is not np.ndarray:
            return None
        return (kind, id(x), id(out), op, algo, root, inplace, timeout, compress)

    def find(self, key: tuple, x: np.ndarray, out: Any) -> Remembered | None:
        try:
            entry = self._entries.get(key)
        except TypeError:  # an unhashable argument: the full path reports what is wrong
            return None
        if entry is None or entry.x is not x or entry.out is not out:
            return None
        return entry if entry.still_holds(x, out) else None

    def remember(
        self, key: tuple, x: Any, call: Prepared, out: Any, inplace: bool, spec: Any
    ) -> None:
        """Keeps a call that went through every check, when its buffers are the caller's own
        (a strided input is copied per call and is not kept)."""
        if call.inp is not x or (out is not None and call.out is not out):
            return
        if out is not None and out.nbytes > MAX_BYTES:
            return
        try:
            hash(key)
        except TypeError:
            return
        new_result = out is None and not inplace and call.out is not None
        if len(self._entries) >= CAPACITY:  # drop the oldest (tolerating a concurrent drop)
            self._entries.pop(next(iter(self._entries), None), None)
        self._entries[key] = Remembered(
            x=x,
            out=out,
            shape=x.shape,
            dtype=x.dtype,
            strides=x.strides,
            out_layout=None if out is None else (out.shape, out.dtype, out.strides),
            result_shape=call.out.shape if new_result else None,
            inplace=inplace,
            spec=spec,
        )
