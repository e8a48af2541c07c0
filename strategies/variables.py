"""Distributed variables: one numpy copy per local replica.

``Variable(initial_value, ...)`` inside ``strategy.scope()`` creates

- a :class:`MirroredVariable` (``synchronization`` AUTO or ON_WRITE): the copies are kept
  identical. In a replica context (inside ``strategy.run``) every replica must make the same
  ``assign``/``assign_add``/``assign_sub`` calls; they meet, the values are combined by the
  variable's ``aggregation`` and every copy gets the same update:

  ==================  ====================================================================
  aggregation         replica-context update with value v_r from replica r
  ==================  ====================================================================
  NONE                allowed only when every replica passes the same value; else an error
  SUM                 the update uses sum(v_r)
  MEAN                the update uses mean(v_r)
  ONLY_FIRST_REPLICA  the update uses v_0 (the other replicas' values are ignored)
  ==================  ====================================================================

  In a cross-replica context an update applies to every copy (a PerReplica value is first
  combined by the aggregation).
- a :class:`SyncOnReadVariable` (``synchronization=ON_READ``): each replica keeps and updates
  its own value without communication; reading it in a cross-replica context aggregates the
  copies (SUM, MEAN or ONLY_FIRST_REPLICA). This is what metrics use.

Outside any scope, ``Variable`` creates a MirroredVariable of the default strategy (one copy).
Copies are numpy arrays, always updated in place, so ``torch.from_numpy(np.asarray(v))`` (or of
a component) keeps sharing memory with the variable.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from . import _context, _tensors
from ._variable_ops import VariableOps
from .reduce_util import ReduceOp
from .values import DistributedValues, Mirrored


class VariableSynchronization(enum.Enum):
    """Indicates when a distributed variable will be synced."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(enum.Enum):
    """Indicates how a distributed variable will be aggregated."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


def _parse_enum(enum_cls: type[enum.Enum], value: Any, what: str) -> Any:
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str) and value.upper() in enum_cls.__members__:
        return enum_cls[value.upper()]
    names = ", ".join(f"{enum_cls.__name__}.{m}" for m in enum_cls.__members__)
    raise ValueError(f"{what} must be one of {names}, got {value!r}")


class _VariableMeta(type):
    """``Variable(...)`` builds the distributed variable the current strategy wants."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Variable:
            return _create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Variable(metaclass=_VariableMeta):
    """A variable: ``Variable(initial_value, trainable=None, name=None, dtype=None,
    aggregation=VariableAggregation.NONE, synchronization=VariableSynchronization.AUTO,
    shape=None)``.

    Calling ``Variable`` creates a distributed variable for the current strategy (see the
    module docstring); ``isinstance(v, Variable)`` holds for every variable of this package.
    ``initial_value`` may be a numpy array, a torch CPU tensor, a number, or a callable
    returning one.
    """


def _create_variable(
    initial_value: Any = None,
    trainable: bool | None = None,
    name: str | None = None,
    dtype: Any = None,
    aggregation: Any = VariableAggregation.NONE,
    synchronization: Any = VariableSynchronization.AUTO,
    shape: Any = None,
) -> DistributedVariable:
    if initial_value is None:
        raise ValueError("Variable needs an initial_value")
    aggregation = _parse_enum(VariableAggregation, aggregation, "aggregation")
    synchronization = _parse_enum(VariableSynchronization, synchronization, "synchronization")
    if synchronization == VariableSynchronization.NONE:
        raise ValueError(
            "VariableSynchronization.NONE is not supported with distribution "
            "strategies; use AUTO/ON_WRITE (mirrored) or ON_READ (sync on read)"
        )
    if synchronization == VariableSynchronization.AUTO:
        synchronization = VariableSynchronization.ON_WRITE
    if trainable is None:
        trainable = synchronization != VariableSynchronization.ON_READ
    elif trainable and synchronization == VariableSynchronization.ON_READ:
        raise ValueError(
            "Synchronization value can be set to VariableSynchronization.ON_READ "
            "only for non-trainable variables; pass trainable=False"
        )
    frame = _context.current_frame()
    if frame is not None and frame.replica_context is not None:
        raise RuntimeError(
            "Variables are created in strategy.scope() (a cross-replica "
            "context), not inside strategy.run(); create them before calling run"
        )
    value = initial_value() if callable(initial_value) else initial_value
    arr = np.array(_tensors.to_numpy(value, "initial_value"), dtype=dtype, copy=True, order="C")
    if shape is not None and tuple(shape) != arr.shape:
        raise ValueError(f"initial_value has shape {arr.shape} but shape={tuple(shape)}")
    strategy = _context.get_strategy()
    return strategy.extended._create_variable(
        arr,
        name=name or "Variable",
        trainable=bool(trainable),
        aggregation=aggregation,
        synchronization=synchronization,
    )


class DistributedVariable(VariableOps, Variable, DistributedValues):
    """Holds a map from replica to variables: one numpy copy per local replica.

    ``values`` are the per-replica :class:`ComponentVariable` objects.
    """

    def __init__(
        self,
        strategy: Any,
        arrays: list[np.ndarray],
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
    ) -> None:
        self._strategy = strategy
        self._arrays = [_tensors.contiguous(a) for a in arrays]
        self._name = name
        self._trainable = trainable
        self._aggregation = aggregation
        self._synchronization = synchronization
        self._initial_value = self._arrays[0].copy()
        DistributedValues.__init__(self, [ComponentVariable(self, i) for i in range(len(arrays))])

    # Properties ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> np.dtype:
        return self._arrays[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._arrays[0].shape

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._synchronization

    @property
    def distribute_strategy(self) -> Any:
        return self._strategy

    @property
    def device(self) -> str:
        return self._strategy.extended.worker_devices[self._index_or_primary()]

    @property
    def initial_value(self) -> np.ndarray:
        return self._initial_value.copy()

    @property
    def is_distributed_variable(self) -> bool:
        return True

    def is_initialized(self, name: str | None = None) -> bool:
        return True

    def get_shape(self) -> tuple[int, ...]:
        return self.shape

    # Reading ------------------------------------------------------------------------------------

    def _replica_id(self) -> int | None:
        """This replica's local index when called inside run() of this variable's strategy (or
        in the default replica context for a default-strategy variable); None in a
        cross-replica context."""
        ctx = _context.get_replica_context()
        if ctx is None or ctx.strategy is not self._strategy:
            return None
        return ctx._local_id

    def _index_or_primary(self) -> int:
        rid = self._replica_id()
        return 0 if rid is None else rid

    def value(self) -> np.ndarray:
        """This replica's value (a read-only view of its copy) inside run; in a cross-replica
        context the primary copy (mirrored) or the aggregate (sync on read)."""
        rid = self._replica_id()
        if rid is None:
            return _readonly(self._read_cross_replica())
        return _readonly(self._arrays[rid])

    def read_value(self) -> np.ndarray:
        """Like :meth:`value`, as a copy (a snapshot)."""
        return np.array(self.value(), copy=True)

    def numpy(self) -> np.ndarray:
        return self.read_value()

    def _read(self) -> np.ndarray:
        return self.value()

    def _live(self) -> np.ndarray:
        rid = self._replica_id()
        return self._read_cross_replica() if rid is None else self._arrays[rid]

    def _read_cross_replica(self) -> np.ndarray:
        raise NotImplementedError

    # Writing ------------------------------------------------------------------------------------

    def assign(
        self,
        value: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._update("assign", value)
        return self if read_value else None

    def assign_add(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._update("assign_add", delta)
        return self if read_value else None

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._update("assign_sub", delta)
        return self if read_value else None

    def _update(self, kind: str, value: Any) -> None:
        raise NotImplementedError

    def _convert(self, value: Any) -> np.ndarray:
        arr = np.asarray(_tensors.to_numpy(value, f"value assigned to {self._name!r}"))
        if arr.shape != self.shape:
            raise ValueError(
                f"Cannot update variable {self._name!r} of shape "
                f"{self.shape} with a value of shape {arr.shape}"
            )
        return _tensors.contiguous(arr.astype(self.dtype, copy=False))

    def _apply(self, index: int, kind: str, value: np.ndarray) -> None:
        arr = self._arrays[index]
        if kind == "assign":
            np.copyto(arr, value, casting="unsafe")
        elif kind == "assign_add":
            np.add(arr, value, out=arr, casting="unsafe")
        elif kind == "assign_sub":
            np.subtract(arr, value, out=arr, casting="unsafe")
        else:  # pragma: no cover
            raise ValueError(kind)

    # Checkpoints ---------------------------------------------------------------------------------

    def _checkpoint_value(self) -> np.ndarray:
        return np.array(self._read_cross_replica(), copy=True)

    def _restore(self, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ValueError(
                f"checkpoint value for variable {self._name!r} has shape "
                f"{value.shape}, but the variable has shape {self.shape}"
            )
        self._restore_value(_tensors.contiguous(value.astype(self.dtype, copy=False)))

    def _restore_value(self, value: np.ndarray) -> None:
        for i in range(len(self._arrays)):
            self._apply(i, "assign", value)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._name!r} shape={self.shape} dtype={self.dtype} "
            f"replicas={len(self._arrays)} aggregation={self._aggregation.name}>"
        )

    __hash__ = object.__hash__


class MirroredVariable(DistributedVariable):
    """Holds a map from replica to variables whose values are kept in sync."""

    def _read_cross_replica(self) -> np.ndarray:
        return self._arrays[0]

    def _update(self, kind: str, value: Any) -> None:
        rid = self._replica_id()
        if rid is not None:
            self._update_replica_context(kind, value)
        else:
            self._update_cross_replica(kind, value)

    def _update_replica_context(self, kind: str, value: Any) -> None:
        ctx = _context.get_replica_context()
        val = self._convert(value)
        agg = self._aggregation
        n_sync = self._strategy.num_replicas_in_sync
        backend = self._strategy.extended.backend

        def combine_and_apply(values: list[np.ndarray]) -> list[None]:
            if agg == VariableAggregation.NONE:
                if n_sync > 1:
                    differ = backend.all_equal(values)
                    if differ is not None:
                        raise ValueError(
                            f"MirroredVariable {self._name!r} has aggregation NONE, but in "
                            f"replica context replicas {differ[0]} and {differ[1]} called "
                            f"{kind} with different values. Pass aggregation="
                            "VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA to Variable(), "
                            "or update it in a cross-replica context (merge_call or "
                            "strategy.extended.update)"
                        )
                combined = values
            elif agg == VariableAggregation.ONLY_FIRST_REPLICA:
                combined = backend.broadcast(values, root=0) if n_sync > 1 else values
            else:
                combined = backend.allreduce(values, ReduceOp.from_variable_aggregation(agg))
            for i, v in enumerate(combined):
                self._apply(i, kind, v)
            return [None] * len(values)

        ctx._exchange(f"{kind} of variable {self._name!r}", val, combine_and_apply)

    def _update_cross_replica(self, kind: str, value: Any) -> None:
        n_local = len(self._arrays)
        if isinstance(value, Mirrored):
            vals = [self._convert(v) for v in value.values]
        elif isinstance(value, DistributedValues) and not isinstance(value, DistributedVariable):
            vals = _aggregate_per_replica(self, [self._convert(v) for v in value.values])
        else:
            vals = [self._convert(value)] * n_local
        if len(vals) != n_local:
            raise ValueError(
                f"{kind}: {len(vals)} values for variable {self._name!r} with {n_local} replicas"
            )
        for i, v in enumerate(vals):
            self._apply(i, kind, v)


def _aggregate_per_replica(var: DistributedVariable, values: list[np.ndarray]) -> list:
    """Combines a PerReplica value by the variable's aggregation (cross-replica updates)."""
    agg = var._aggregation
    backend = var._strategy.extended.backend
    if agg == VariableAggregation.NONE:
        if backend.num_replicas_in_sync == 1:
            return values
        raise ValueError(
            f"Cannot update MirroredVariable {var._name!r} (aggregation NONE) with "
            "a PerReplica value: pass aggregation=SUM, MEAN or "
            "ONLY_FIRST_REPLICA to Variable(), or reduce the value first"
        )
    if agg == VariableAggregation.ONLY_FIRST_REPLICA:
        return backend.broadcast(values, root=0)
    return backend.allreduce(values, ReduceOp.from_variable_aggregation(agg))


class SyncOnReadVariable(DistributedVariable):
    """Holds a map from replica to variables whose values are reduced on read (and on save).

    Inside run each replica reads and updates its own copy, with no communication. In a
    cross-replica context a read aggregates the copies: SUM or MEAN over all replicas in sync
    (a collective), or replica 0's copy for ONLY_FIRST_REPLICA. A cross-replica ``assign(v)``
    sets every copy so that the aggregate reads ``v`` (each copy gets ``v / n`` for SUM).
    """

    def _read_cross_replica(self) -> np.ndarray:
        agg = self._aggregation
        if agg == VariableAggregation.ONLY_FIRST_REPLICA:
            return self._arrays[0]
        if agg == VariableAggregation.NONE:
            raise ValueError(
                f"Cannot read SyncOnReadVariable {self._name!r} in a cross-replica "
                "context: its aggregation is NONE; create it with aggregation="
                "VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA"
            )
        backend = self._strategy.extended.backend
        op = ReduceOp.from_variable_aggregation(agg)
        return backend.allreduce([a.copy() for a in self._arrays], op)[0]

    def _update(self, kind: str, value: Any) -> None:
        rid = self._replica_id()
        if rid is not None:
            self._apply(rid, kind, self._convert(value))
            return
        if kind != "assign" and self._aggregation == VariableAggregation.SUM:
            raise ValueError(
                f"SyncOnReadVariable does not support `{kind}` in cross-replica "
                "context when aggregation is set to VariableAggregation.SUM "
                f"(variable {self._name!r}); use assign, or update it inside run"
            )
        n_local = len(self._arrays)
        if isinstance(value, DistributedValues) and not isinstance(value, DistributedVariable):
            vals = [self._convert(v) for v in value.values]
        else:
            val = self._convert(value)
            if kind == "assign" and self._aggregation == VariableAggregation.SUM:
                n = self._strategy.num_replicas_in_sync
                val = np.asarray(val / n).astype(self.dtype)
            vals = [val] * n_local
        for i, v in enumerate(vals):
            self._apply(i, kind, v)

    def _checkpoint_value(self) -> np.ndarray:
        if self._aggregation == VariableAggregation.NONE:
            return self._arrays[0].copy()
        return np.array(self._read_cross_replica(), copy=True)

    def _restore_value(self, value: np.ndarray) -> None:
        if self._aggregation == VariableAggregation.SUM:
            value = np.asarray(value / self._strategy.num_replicas_in_sync).astype(self.dtype)
        for i in range(len(self._arrays)):
            self._apply(i, "assign", value)


class ComponentVariable(VariableOps):
    """One replica's copy of a distributed variable (``var.values[i]``).

    Its updates touch only that copy, without aggregation: it is what
    ``strategy.extended.update(var, fn)`` hands to ``fn``. ``np.asarray(component)`` is the
    live copy (shares memory).
    """

    def __init__(self, container: DistributedVariable, index: int) -> None:
        self._container = container
        self._index = index

    @property
    def _distributed_container(self) -> DistributedVariable:
        return self._container

    @property
    def name(self) -> str:
        return f"{self._container.name}/replica_{self._index}"

    @property
    def dtype(self) -> np.dtype:
        return self._container.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._container.shape

    @property
    def device(self) -> str:
        return self._container.distribute_strategy.extended.worker_devices[self._index]

    def _live(self) -> np.ndarray:
        return self._container._arrays[self._index]

    def _read(self) -> np.ndarray:
        return self.value()

    def value(self) -> np.ndarray:
        return _readonly(self._live())

    def read_value(self) -> np.ndarray:
        return self._live().copy()

    def numpy(self) -> np.ndarray:
        return self._live().copy()

    def assign(
        self,
        value: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._container._apply(self._index, "assign", self._container._convert(value))
        return self if read_value else None

    def assign_add(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._container._apply(self._index, "assign_add", self._container._convert(delta))
        return self if read_value else None

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Any:
        self._container._apply(self._index, "assign_sub", self._container._convert(delta))
        return self if read_value else None

    def __repr__(self) -> str:
        return f"<ComponentVariable {self.name!r} shape={self.shape} dtype={self.dtype}>"


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def variables_in(structure: Any) -> list[DistributedVariable]:
    """The distributed variables among the leaves of a nest."""
    from . import _nest

    return [x for x in _nest.flatten(structure) if isinstance(x, DistributedVariable)]
