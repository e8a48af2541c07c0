"""Reduction operators and the names users may type for them."""

from __future__ import annotations

import enum

from pycollective._ext import _C

_NATIVE = _C.enum_codes()["reduce_op"]


class ReduceOp(enum.IntEnum):
    """Element-wise reduction. ``AVG`` is a sum followed by one division by the group size
    (floating dtypes only). The codes are the extension's (csrc/core/dtype.h)."""

    SUM = _NATIVE["sum"]
    PROD = _NATIVE["prod"]
    MIN = _NATIVE["min"]
    MAX = _NATIVE["max"]
    AVG = _NATIVE["avg"]


if {op.name.lower() for op in ReduceOp} != set(_NATIVE):  # pragma: no cover - a build mismatch
    raise ImportError(
        f"pycollective._C reduces with {sorted(_NATIVE)}, but ReduceOp has "
        f"{sorted(op.name.lower() for op in ReduceOp)}: reinstall pycollective"
    )


_ALIASES = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PROD,
    "product": ReduceOp.PROD,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "mean": ReduceOp.AVG,
}


def parse_op(op: str | ReduceOp) -> ReduceOp:
    """Returns the ReduceOp for a name ("sum", "prod", "min", "max", "avg"/"mean") or member."""
    found = _ALIASES.get(op) if isinstance(op, str) else None
    if found is not None:
        return found
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.lower() in _ALIASES:
        return _ALIASES[op.lower()]
    raise ValueError(f"unknown op {op!r}; choose one of sum, prod, min, max, avg")
