"""ReduceOp: how values are combined across replicas (tf.distribute.ReduceOp)."""

from __future__ import annotations

import enum
from typing import Any


class ReduceOp(enum.Enum):
    """Indicates how a set of values should be reduced.

    ``SUM`` adds the values of all replicas; ``MEAN`` takes their arithmetic mean (for integer
    tensors: the sum divided by the replica count, cast back to the integer dtype).
    """

    SUM = "SUM"
    MEAN = "MEAN"

    @staticmethod
    def from_variable_aggregation(aggregation: Any) -> ReduceOp:
        """The ReduceOp of a ``VariableAggregation`` (SUM or MEAN)."""
        name = getattr(aggregation, "name", str(aggregation))
        if name == "SUM":
            return ReduceOp.SUM
        if name == "MEAN":
            return ReduceOp.MEAN
        raise ValueError(
            f"Could not convert from VariableAggregation {name} to ReduceOp: only "
            "SUM and MEAN aggregations reduce across replicas"
        )


def parse_reduce_op(op: Any) -> ReduceOp:
    """A ReduceOp from a member or a name ("SUM", "sum", "MEAN", "mean")."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ("SUM", "MEAN"):
        return ReduceOp[op.upper()]
    raise ValueError(
        f"reduce_op must be ReduceOp.SUM or ReduceOp.MEAN (or 'SUM'/'MEAN'), got {op!r}"
    )
