"""TPUMirroredVariable: one device array replicated over the strategy's mesh.

Outside ``strategy.run`` the variable reads as a numpy copy of that array and its updates go to
the devices at once. Inside ``run`` (while the replica step is traced) it reads as the step's
current traced value, and its updates are recorded in the step (:mod:`.step`) and become outputs
of the compiled program; the arrays are replaced when the program has run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _tensors
from ..reduce_util import ReduceOp
from ..values import DistributedValues
from ..variables import (
    ComponentVariable,
    DistributedVariable,
    MirroredVariable,
    VariableAggregation,
    _readonly,
)
from . import step as _step


class TPUMirroredVariable(MirroredVariable):
    """A variable of TPUStrategy: one array, replicated on every device of the mesh.

    Read it with ``value()``/``numpy()``, ``np.asarray(v)`` or, inside a replica function, as a
    JAX value (``v.value()``, ``jnp.asarray(v)``, ``v @ x``). In a replica function every
    replica's ``assign`` is combined by the variable's ``aggregation`` with XLA collectives (as
    MirroredStrategy does with pycollective's); see docs/strategies.md.
    """

    #: the step state is one array for all replicas (sync-on-read: one row per replica)
    _per_replica = False

    def __init__(
        self,
        strategy: Any,
        initial: np.ndarray,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: Any,
    ) -> None:
        self._strategy = strategy
        self._name = name
        self._trainable = trainable
        self._aggregation = aggregation
        self._synchronization = synchronization
        self._dtype = initial.dtype
        self._shape = tuple(initial.shape)
        self._initial_value = initial.copy()
        # Created while a step is traced (optimizer slots on first use), the value stays on
        # the host until the step's output (or the first use) puts it on the devices.
        self._host_cache: np.ndarray | None = initial.copy()
        self._device: Any = None if _step.current() is not None else self._place(initial)
        DistributedValues.__init__(
            self, [ComponentVariable(self, i) for i in range(strategy.extended._num_local_replicas)]
        )

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def device_value(self) -> Any:
        """The replicated ``jax.Array`` (a global array over the strategy's mesh) itself, not a
        copy: it is valid until the next ``run``/``run_steps`` or update of the variable, which
        may donate its buffer to the new value (reading it afterwards raises "Array has been
        deleted"). For a value to keep, use ``jnp.asarray(v)`` (a copy) or ``v.numpy()``."""
        return self._device_value

    @property
    def _device_value(self) -> Any:
        if self._device is None:
            self._device = self._place(self._initial_value)
        return self._device

    def _place(self, value: np.ndarray) -> Any:
        """The device array holding ``value`` as every replica's copy."""
        return self._strategy.extended._replicate(value)

    def _set_device_value(self, array: Any) -> None:
        with self._lock():
            self._device = array
            self._host_cache = None

    # Reading ------------------------------------------------------------------------------------

    def _lock(self) -> Any:
        """Held while a step runs: the step donates the variables' buffers, so a read or update
        from another thread waits for it."""
        return self._strategy.extended._device_lock

    def _host(self) -> np.ndarray:
        with self._lock():
            if self._host_cache is None:
                # x64 off (JAX's default) stores int64/float64 as 32-bit: convert back.
                self._host_cache = np.asarray(self._device_value).astype(self._dtype, copy=True)
            return self._host_cache

    def _device_copy(self) -> Any:
        """A copy of the device value that no later step deletes (the step donates the
        variable's own buffer)."""
        with self._lock():
            if self._per_replica:
                return _step.jnp().asarray(self._host())
            return _step.jnp().array(self._device_value, copy=True)

    @property
    def _arrays(self) -> list[np.ndarray]:
        """Each local replica's copy, as (read-only) numpy arrays."""
        host = _readonly(self._host())
        return [host] * len(self._values)

    def value(self) -> Any:
        """Inside a replica function: this replica's (traced) value. Otherwise a read-only numpy
        copy of the variable."""
        traced = _step.read(self)
        if traced is not None:
            return traced
        trace = _step.current()
        if trace is not None:
            raise ValueError(
                f"variable {self._name!r} belongs to {self._strategy!r}, but a step "
                f"of {trace.strategy!r} is being compiled; a step can only use its "
                "own strategy's variables"
            )
        return _readonly(self._host())

    def _read_cross_replica(self) -> np.ndarray:
        return self._host()

    def _live(self) -> Any:
        return self.value()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if _step.read(self) is not None:
            raise _step.StepTraceError(
                f"numpy read variable {self._name!r} inside a compiled TPUStrategy step, where "
                "it is an abstract (traced) value; use v.value() or jax.numpy on it"
            )
        return super().__array__(dtype, copy)

    def __jax_array__(self) -> Any:
        traced = _step.read(self)
        return traced if traced is not None else self._device_copy()

    # Writing ------------------------------------------------------------------------------------

    def _update(self, kind: str, value: Any) -> None:
        if _step.tracing_for(self._strategy):
            _step.write(self, kind, value)
            return
        with self._lock():
            self._update_now(kind, value)

    def _update_now(self, kind: str, value: Any) -> None:
        if isinstance(value, DistributedValues) and not isinstance(value, DistributedVariable):
            value = self._aggregate(value, kind)
        new = self._convert(value)
        current = self._host()
        if kind == "assign_add":
            new = current + new
        elif kind == "assign_sub":
            new = current - new
        self._restore_value(np.asarray(new, dtype=self._dtype))

    def _aggregate(self, value: DistributedValues, kind: str) -> Any:
        agg = self._aggregation
        if agg == VariableAggregation.ONLY_FIRST_REPLICA:
            return self._strategy.experimental_local_results(value)[0]
        if agg == VariableAggregation.NONE:
            if self._strategy.num_replicas_in_sync == 1:
                return self._strategy.experimental_local_results(value)[0]
            raise ValueError(
                f"Cannot {kind} TPUMirroredVariable {self._name!r} (aggregation "
                "NONE) with a PerReplica value: pass aggregation=SUM, MEAN or "
                "ONLY_FIRST_REPLICA to Variable(), or reduce the value first"
            )
        return self._strategy.reduce(ReduceOp.from_variable_aggregation(agg), value, axis=None)

    def _convert(self, value: Any) -> np.ndarray:
        if (
            not isinstance(value, np.ndarray)
            and hasattr(value, "__array__")
            and not _tensors.is_torch(value)
        ):
            value = np.asarray(value)
        return super()._convert(value)

    def _apply(self, index: int, kind: str, value: np.ndarray) -> None:
        raise TypeError(
            f"TPUMirroredVariable {self._name!r} is one array replicated on every device; a "
            "single replica's copy cannot be updated on its own. Update the variable itself "
            "(var.assign...), or use strategy.extended.update(var, fn), whose fn gets the "
            "variable"
        )

    def _restore_value(self, value: np.ndarray) -> None:
        self._set_device_value(self._place(value))

    def __repr__(self) -> str:
        return (
            f"<TPUMirroredVariable {self._name!r} shape={self.shape} dtype={self.dtype} "
            f"devices={self._strategy.num_replicas_in_sync} "
            f"aggregation={self._aggregation.name}>"
        )

    __hash__ = object.__hash__


class TPUSyncOnReadVariable(TPUMirroredVariable):
    """A sync-on-read variable of TPUStrategy (``synchronization=ON_READ``, e.g. a metric).

    Every replica keeps its own copy: one global array ``(replicas, *shape)`` sharded over the
    mesh. Inside a replica function a replica reads and updates its copy without communication;
    outside, a read aggregates the copies with XLA (SUM, MEAN, or replica 0's copy for
    ONLY_FIRST_REPLICA). A cross-replica ``assign(v)`` sets the copies so that the aggregate
    reads ``v`` (each copy ``v / n`` for SUM).
    """

    _per_replica = True

    def _place(self, value: np.ndarray) -> Any:
        ext = self._strategy.extended
        host = np.asarray(value)
        return ext._shard_rows([host[None]] * ext._num_local_replicas)

    def _copies(self) -> tuple[Any, ...]:
        from .values import TPUPerReplica

        with self._lock():
            return TPUPerReplica(
                self._device_value, self._strategy.extended._local_positions
            ).values

    @property
    def _arrays(self) -> list[np.ndarray]:
        with self._lock():  # the copies are views of the buffer that a step donates
            return [_readonly(np.asarray(c).astype(self._dtype)) for c in self._copies()]

    def _host(self) -> np.ndarray:
        with self._lock():
            if self._host_cache is None:
                self._host_cache = self._aggregate_copies()
            return self._host_cache

    def _aggregate_copies(self) -> np.ndarray:
        from . import reductions

        agg = self._aggregation
        if agg == VariableAggregation.ONLY_FIRST_REPLICA:
            value = np.asarray(reductions.first_row(self._device_value))
        elif agg == VariableAggregation.NONE:
            raise ValueError(
                f"Cannot read SyncOnReadVariable {self._name!r} in a cross-replica "
                "context: its aggregation is NONE; create it with aggregation="
                "VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA"
            )
        else:
            value = np.asarray(
                reductions.reduce_global(
                    self._device_value, ReduceOp.from_variable_aggregation(agg), None
                )
            )
        return value.astype(self._dtype)

    def _checkpoint_value(self) -> np.ndarray:
        if self._aggregation == VariableAggregation.NONE:
            with self._lock():
                return np.asarray(self._copies()[0]).astype(self._dtype)
        return self._host().copy()

    def _update_now(self, kind: str, value: Any) -> None:
        if kind != "assign" and self._aggregation == VariableAggregation.SUM:
            raise ValueError(
                f"SyncOnReadVariable does not support `{kind}` in cross-replica "
                "context when aggregation is set to VariableAggregation.SUM "
                f"(variable {self._name!r}); use assign, or update it inside run"
            )
        new = self._convert(value)
        if kind == "assign":
            self._restore_value(new)
            return
        delta = self._strategy.extended._replicate(new if kind == "assign_add" else -new)
        self._set_device_value(self._device_value + delta)

    def _restore_value(self, value: np.ndarray) -> None:
        if self._aggregation == VariableAggregation.SUM:
            value = np.asarray(value / self._strategy.num_replicas_in_sync).astype(self._dtype)
        self._set_device_value(self._place(value))

    def __repr__(self) -> str:
        return (
            f"<TPUSyncOnReadVariable {self._name!r} shape={self.shape} dtype={self.dtype} "
            f"replicas={self._strategy.num_replicas_in_sync} "
            f"aggregation={self._aggregation.name}>"
        )

    __hash__ = object.__hash__


_registered: list[bool] = []


def register_pytree() -> None:
    """Lets a variable stand where JAX wants an array (``jnp.sum(v)``, ``jax.grad(f)(v)``):
    as a pytree it flattens to its current value (traced inside a step) and rebuilds as that
    value, not as a variable."""
    if _registered:
        return
    import jax

    for cls in (TPUMirroredVariable, TPUSyncOnReadVariable):
        jax.tree_util.register_pytree_node(
            cls,
            lambda v: ((v.value() if _step.read(v) is not None else v._device_copy(),), None),
            lambda _, children: children[0],
        )
    _registered.append(True)
