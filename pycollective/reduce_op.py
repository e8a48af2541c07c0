"""Reduction operators and the names users may type for them."""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """Element-wise reduction. ``AVG`` is a sum followed by one division by the group size
    (floating dtypes only)."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


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
