"""Calls a process group has checked before: a loop that calls ``allreduce(x, out=y)`` on numpy
arrays skips adapting, checking and specifying them again on every call, which costs several
times a small collective itself (on one rank, an 8-byte call measured 6.4 us on the full
path, 1.9 us remembered, 0.6 us prepared when this was written; 0.70 us remembered and 0.30
prepared on a later machine and build; with 4 ranks on 2 cores each rank's Python also waits
for the core its peers hold).

A call is remembered by its scalar arguments and its arrays' layouts (dtype, shape, strides),
not by the arrays themselves: every check the full path makes follows from those (the dtype's
native code, contiguity, the result's shape, ``out=``'s dtype and shape), except that an array
written to must be writable, which is checked on every call. So fresh arrays of a known layout
hit too, an array reshaped or re-typed in place is another layout, and no array is kept alive.
The scalar arguments select a native ``KnownLayouts`` (csrc/bindings/bind_known_calls.cc),
which matches the layouts, reads each array's data pointer and runs the call without coming
back to Python. Arrays of any size take this path: the checks were thought negligible past 64
KiB, where remembering used to stop, but each rank's Python also delays its peers, the more so
when they share cores (2, 3 and 4 ranks on 2 cores, ``allreduce(x, out=y)`` on the full path
against remembered: 1.49x-1.64x the time at 128 KiB, 1.19x-1.28x at 512 KiB, 1.07x-1.13x at 2
MiB). New results of 1 MiB and more come from the output pool on this path as on the full one
(``_C.new_result``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pycollective import _C
from pycollective._calls import Prepared

#: combinations of scalar arguments remembered per group (each with up to 16 layouts, natively);
#: the oldest is dropped first
CAPACITY = 64


#: The keys ``ProcessGroup._run`` makes for ``allreduce(x, out=y)`` and ``allreduce(x)`` with
#: every other argument at its default: the call a training loop makes.
PLAIN_ALLREDUCE_OUT = ("allreduce", str, "sum", "auto", int, 0, False, False, None, None)
PLAIN_ALLREDUCE_NEW = ("allreduce", str, "sum", "auto", int, 0, False, True, None, None)


class CallMemo(dict):
    """Per group: a call's scalar arguments (the key ``ProcessGroup._run`` makes) -> the native
    layouts checked with them, which run the call (``KnownLayouts.run``). A dict, so that the
    lookup on every small call is the dict's own. Safe without a lock: a lost entry is only
    checked anew.

    The plain all-reduce's layouts are also kept in ``plain_out`` and ``plain_new``, which
    ``ProcessGroup.allreduce`` (and ``pycollective.allreduce``, for the default group) read
    without making a key: with 4 ranks on 2 cores every bit of Python before the native call
    costs several times what it costs alone (building the key and looking it up: 1.8 us of a
    5.6 us call), since each delay makes the ranks sharing a core hand it over more often."""

    __slots__ = ("_members", "plain_out", "plain_new")

    def __init__(self, members: Any) -> None:
        super().__init__()
        self._members = members
        self.plain_out: Any = None
        self.plain_new: Any = None

    def remember(
        self, key: tuple, x: Any, call: Prepared, out: Any, inplace: bool, spec: Any
    ) -> None:
        """Keeps a call that went through every check, when it ran on the caller's own numpy
        arrays (a strided input is copied per call and is not kept)."""
        if type(x) is not np.ndarray:
            return
        if out is not None and (type(out) is not np.ndarray or call.out is not out):
            return
        if call.inp is not x:
            return
        if call.out is None:
            if inplace:  # reduce off the root: the full path still wants x writable
                return
            writes = "none"
        else:
            writes = "inplace" if inplace else "out" if out is not None else "new"
        try:
            layouts = self.get(key)
            if layouts is None:
                if len(self) >= CAPACITY:  # drop the oldest (tolerating a concurrent drop)
                    self.pop(next(iter(self), None), None)  # type: ignore[arg-type]
                layouts = self[key] = _C.KnownLayouts(self._members)
        except TypeError:  # an unhashable argument that the checks let through
            return
        if key == PLAIN_ALLREDUCE_OUT:
            self.plain_out = layouts
        elif key == PLAIN_ALLREDUCE_NEW:
            self.plain_new = layouts
        layouts.remember(x, out, writes, spec, call.out)
