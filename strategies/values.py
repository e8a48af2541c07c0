"""Distributed values: one value per local replica.

- :class:`PerReplica`: unsynchronized values, e.g. what ``strategy.run`` returns or a batch of
  a distributed dataset.
- :class:`Mirrored`: values known to be identical on every replica, e.g. the result of
  ``extended.reduce_to``.

Variables (:mod:`.variables`) are distributed values too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _context, _nest
from ._variable_ops import VariableOps


class DistributedValues:
    """Base class for representing distributed values: a tuple with one value per local
    replica, in replica order."""

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = tuple(values)
        if not self._values:
            raise ValueError(f"{type(self).__name__} needs at least one value")

    @property
    def values(self) -> tuple[Any, ...]:
        """Returns the per replica values."""
        return self._values

    def _get_on_device_or_primary(self) -> Any:
        """This replica's value inside ``run``, else the first replica's."""
        index = _current_local_replica(self)
        return self._values[index if index is not None else 0]

    def __repr__(self) -> str:
        inner = ",\n  ".join(f"{i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n  {inner}\n}}"


class PerReplica(DistributedValues):
    """Holds a map from replica to unsynchronized values."""


class Mirrored(DistributedValues):
    """Holds a map from replica to values which are kept in sync. Reads as this replica's value
    (the primary value outside ``run``)."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = np.asarray(self._get_on_device_or_primary())
        return arr.astype(dtype) if dtype is not None else arr

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get_on_device_or_primary(), name)


def _current_local_replica(value: Any) -> int | None:
    ctx = _context.get_replica_context()
    if ctx is None or getattr(ctx, "_local_id", None) is None:
        return None
    index = ctx._local_id
    return index if index < len(value.values) else None


def _is_per_replica_container(x: Any) -> bool:
    """A distributed value that run() splits per replica (variables are passed whole)."""
    return isinstance(x, DistributedValues) and not isinstance(x, VariableOps)


def check_replica_counts(n: int, structure: Any) -> None:
    """run()'s arguments: every per-replica leaf holds one component per local replica (a
    shorter one would fail deep in select_replica, a longer one lose components silently)."""
    for leaf in _nest.flatten(structure):
        if _is_per_replica_container(leaf) and len(leaf.values) != n:
            raise ValueError(
                f"run() got a {type(leaf).__name__} of {len(leaf.values)} values, but this "
                f"strategy runs {n} replica(s) in this process: make per-replica arguments "
                "with this strategy's experimental_distribute_dataset or "
                "experimental_distribute_values_from_function"
            )


def select_replica(index: int, structure: Any) -> Any:
    """Replica ``index``'s part of a nest: PerReplica/Mirrored leaves give their component;
    variables and plain values are passed as they are."""
    if not _nest.is_nested(structure):
        return structure.values[index] if _is_per_replica_container(structure) else structure
    if structure == ():  # run()'s usual empty args: immutable, so one object serves all
        return structure
    return _nest.map_structure(
        lambda x: x.values[index] if _is_per_replica_container(x) else x, structure
    )


def regroup(per_replica: Sequence[Any], wrap: type = PerReplica, always_wrap: bool = False) -> Any:
    """Combines one nest per replica into one nest of distributed values.

    A leaf that is the same object on every replica stays as it is (a variable passed to every
    replica, or anything when there is one replica), unless ``always_wrap``.
    """
    first = per_replica[0]
    if len(per_replica) == 1 and not always_wrap:
        return first  # every leaf is the same object on every (the one) replica
    for other in per_replica[1:]:
        _nest.assert_same_structure(first, other, "the replicas' results")
    flats = [_nest.flatten(v) for v in per_replica]
    leaves = []
    for column in zip(*flats):
        if not always_wrap and all(v is column[0] for v in column[1:]):
            leaves.append(column[0])
        else:
            leaves.append(wrap(list(column)))
    return _nest.pack_sequence_as(first, leaves)


def local_results(value: Any, num_replicas: int) -> tuple[Any, ...]:
    """One nest per local replica: distributed leaves (variables included) give their
    components; plain leaves are repeated."""

    def pick(i: int) -> Any:
        return (
            _nest.map_structure(
                lambda x: x.values[i] if isinstance(x, DistributedValues) else x, value
            )
            if _nest.is_nested(value)
            else (value.values[i] if isinstance(value, DistributedValues) else value)
        )

    if isinstance(value, DistributedValues) and len(value.values) != num_replicas:
        return value.values
    if not _nest.is_nested(value) and not isinstance(value, DistributedValues):
        return (value,)
    return tuple(pick(i) for i in range(num_replicas))
