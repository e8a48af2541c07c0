"""Variables of ParameterServerStrategy.

In a cluster, a variable lives on a parameter server; what the coordinator and the workers hold
is a handle:

- :class:`ParameterServerVariable`: one variable on one ps task.
- :class:`ShardedVariable`: a variable split along axis 0 into shards on several ps tasks
  (``.variables`` are the shards); it reads as one value.
- optimizer state handles (iterations, slots), so that ``Checkpoint`` saves and restores the
  optimizer state kept on the parameter servers.

Handles are DistributedVariables, so ``Checkpoint`` and the optimizers see variables. Reading
pulls the value (a worker pulls once per scheduled function, and again after it pushed);
``assign``/``assign_add``/``assign_sub`` are applied on the ps.

With one machine (no cluster), :class:`CentralVariable` keeps the one copy of a variable in host
memory (tf's CentralStorageStrategy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._calls import new_output

from .. import _tensors
from ..variables import (
    ComponentVariable,
    DistributedVariable,
    MirroredVariable,
    VariableAggregation,
    VariableSynchronization,
)
from . import ps_pb2 as pb
from . import wire
from .client import PSCall, PSClient, PullEntry
from .errors import ps_task


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of a variable (all of it when unsharded) on ps task ``task``."""

    task: int
    address: str
    key: str
    start: int
    stop: int
    shape: tuple[int, ...]


def split_rows(value: np.ndarray, shards: Sequence[Shard]) -> list[np.ndarray]:
    if len(shards) == 1:
        return [value]
    return [value[s.start : s.stop] for s in shards]


def join_rows(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return np.array(parts[0], copy=True)
    return np.concatenate(parts, axis=0)


class CoordinatorStore:
    """Reads and writes variables with direct calls (the coordinator's view)."""

    def __init__(self, client: PSClient) -> None:
        self.client = client

    def read(self, var: RemoteVariable) -> np.ndarray:
        # Every shard lands straight in its rows of the result: no second copy. The memory comes
        # from the native output pool (a fresh 64 MiB array costs as much in page faults as
        # moving it).
        out = new_output(var.shape, var.dtype)
        by_task: dict[tuple[int, str], list[PullEntry]] = {}
        for s in var._shards:
            rows = out if len(var._shards) == 1 else out[s.start : s.stop]
            by_task.setdefault((s.task, s.address), []).append(
                PullEntry(s.key, s.shape, var.dtype, rows)
            )
        self.client.pull([(t, a, entries) for (t, a), entries in by_task.items()])
        return out

    def write(
        self, var: RemoteVariable, kind: str, value: np.ndarray, create: bool = False
    ) -> None:
        self.client.call_many(assign_calls(var, kind, value, create))


def assign_calls(
    var: RemoteVariable,
    kind: str,
    value: np.ndarray,
    create: bool = False,
    timeout: float | None = None,
) -> list[PSCall]:
    """One Assign call per ps task holding a shard of ``var``."""
    by_task: dict[tuple[int, str], tuple[list[str], list[np.ndarray]]] = {}
    for s, part in zip(var._shards, split_rows(value, var._shards)):
        keys, arrays = by_task.setdefault((s.task, s.address), ([], []))
        keys.append(s.key)
        arrays.append(np.ascontiguousarray(part))
    return [
        PSCall(
            addr,
            task,
            "Assign",
            pb.AssignRequest(keys=keys, kind=kind, create=create, trainable=var.trainable),
            timeout,
            arrays,
        )
        for (task, addr), (keys, arrays) in by_task.items()
    ]


def push_calls(
    optimizer_id: str,
    pairs: Sequence[tuple[Any, Any]],
    worker: int,
    synchronous: bool,
    timeout: float | None = None,
) -> list[PSCall]:
    """One Push call per ps task: the gradients of the shards it holds."""
    by_task: dict[tuple[int, str], tuple[list[str], list[np.ndarray]]] = {}
    for g, var in pairs:
        if not isinstance(var, RemoteVariable) or isinstance(
            var, (SlotVariable, IterationsVariable)
        ):
            raise TypeError(
                f"apply_gradients expects (gradient, variable) pairs with variables "
                f"of the ParameterServerStrategy, got {type(var).__name__}"
            )
        grad = to_numpy_gradient(g, var)
        for s, part in zip(var._shards, split_rows(grad, var._shards)):
            keys, arrays = by_task.setdefault((s.task, s.address), ([], []))
            if s.key in keys:
                raise ValueError(f"apply_gradients got two gradients for variable {var.name!r}")
            keys.append(s.key)
            arrays.append(np.ascontiguousarray(part))
    return [
        PSCall(
            addr,
            task,
            "Push",
            pb.PushRequest(
                optimizer_id=optimizer_id, worker=worker, synchronous=synchronous, keys=keys
            ),
            timeout,
            arrays,
        )
        for (task, addr), (keys, arrays) in by_task.items()
    ]


class RemoteVariable(DistributedVariable):
    """Base of the handles: a variable whose value lives on parameter servers."""

    def __init__(
        self,
        strategy: Any,
        store: Any,
        name: str,
        shape: tuple[int, ...],
        dtype: Any,
        shards: Sequence[Shard],
        trainable: bool,
        aggregation: VariableAggregation = VariableAggregation.NONE,
        synchronization: VariableSynchronization = VariableSynchronization.ON_WRITE,
    ) -> None:
        # DistributedVariable.__init__ would allocate local copies: set the fields directly.
        self._strategy = strategy
        self._store = store
        self._name = name
        self._shape = tuple(int(d) for d in shape)
        self._dtype = np.dtype(dtype)
        self._shards = tuple(shards)
        self._trainable = bool(trainable)
        self._aggregation = aggregation
        self._synchronization = synchronization
        self._values = (self,)

    # Properties ---------------------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def device(self) -> str:
        return f"{ps_task(self._shards[0].task)}/device:CPU:0" if self._shards else ""

    @property
    def initial_value(self) -> np.ndarray:
        raise AttributeError(
            f"{type(self).__name__} {self._name!r} keeps no initial value: it "
            "lives on the parameter servers"
        )

    @property
    def _arrays(self) -> Any:
        raise RuntimeError(
            f"variable {self._name!r} lives on the parameter servers and has no local copies. "
            "Apply gradients inside a function scheduled with ClusterCoordinator.schedule "
            "(optimizer.apply_gradients there pushes them to the parameter servers), or call "
            "strategy.extended.push_gradients(optimizer, grads_and_vars) on the coordinator"
        )

    # Reading and writing -------------------------------------------------------------------------

    def _remote_read(self) -> np.ndarray:
        return self._store.read(self)

    def value(self) -> np.ndarray:
        arr = self._remote_read()
        view = arr.view()
        view.flags.writeable = False
        return view

    def read_value(self) -> np.ndarray:
        return np.array(self._remote_read(), copy=True)

    def numpy(self) -> np.ndarray:
        return self.read_value()

    def _read(self) -> np.ndarray:
        return self.value()

    def _live(self) -> np.ndarray:
        return self._remote_read()

    def _read_cross_replica(self) -> np.ndarray:
        return self._remote_read()

    def _update(self, kind: str, value: Any) -> None:
        self._store.write(self, kind, self._convert(value))

    def _checkpoint_value(self) -> np.ndarray:
        return np.array(self._remote_read(), copy=True)

    def _restore_value(self, value: np.ndarray) -> None:
        # Creates the variable again on a ps task that restarted empty.
        self._store.write(self, "assign", value, create=True)

    def _spec(self) -> tuple:
        """What a worker needs to rebuild this handle (see worker_service.WorkerService)."""
        return (
            type(self).__name__,
            self._name,
            self._shape,
            self._dtype.str,
            tuple((s.task, s.address, s.key, s.start, s.stop, s.shape) for s in self._shards),
            self._trainable,
        )

    def __repr__(self) -> str:
        where = ", ".join(sorted({ps_task(s.task) for s in self._shards}))
        return (
            f"<{type(self).__name__} {self._name!r} shape={self._shape} dtype={self._dtype} "
            f"on {where}>"
        )


class ParameterServerVariable(RemoteVariable):
    """A variable placed on one parameter-server task (``device`` names it)."""


class ShardedVariable(RemoteVariable):
    """A variable split along axis 0 into shards on several parameter-server tasks.

    ``variables`` are the shards (ParameterServerVariables named ``<name>/part_<i>``); reading
    the ShardedVariable concatenates them, assigning splits the value. Gradients for it are
    split the same way when pushed.
    """

    def __init__(
        self,
        strategy: Any,
        store: Any,
        name: str,
        shape: tuple[int, ...],
        dtype: Any,
        shards: Sequence[Shard],
        trainable: bool,
        aggregation: VariableAggregation = VariableAggregation.NONE,
        synchronization: VariableSynchronization = VariableSynchronization.ON_WRITE,
    ) -> None:
        super().__init__(
            strategy, store, name, shape, dtype, shards, trainable, aggregation, synchronization
        )
        self._variables = tuple(
            ParameterServerVariable(
                strategy,
                store,
                f"{name}/part_{i}",
                s.shape,
                dtype,
                [Shard(s.task, s.address, s.key, 0, s.shape[0], s.shape)],
                trainable,
                aggregation,
                synchronization,
            )
            for i, s in enumerate(shards)
        )

    @property
    def variables(self) -> list[ParameterServerVariable]:
        """The shards, in order along axis 0."""
        return list(self._variables)

    @property
    def device(self) -> str:
        return self._variables[0].device


class IterationsVariable(RemoteVariable):
    """An optimizer's ``iterations`` kept on the parameter servers: each ps task counts the
    updates it applied; reading gives the largest count, assigning sets every task's."""

    def __init__(
        self,
        strategy: Any,
        client: PSClient,
        optimizer_id: str,
        name: str,
        tasks: Sequence[tuple[int, str]],
    ) -> None:
        super().__init__(
            strategy, None, name, (), np.int64, (), False, VariableAggregation.ONLY_FIRST_REPLICA
        )
        self._client = client
        self._optimizer_id = optimizer_id
        self._tasks = tuple(tasks)

    def _remote_read(self) -> np.ndarray:
        calls = [
            PSCall(
                addr,
                task,
                "GetOptimizerState",
                pb.OptimizerStateRequest(optimizer_id=self._optimizer_id),
            )
            for task, addr in self._tasks
        ]
        counts = [r.iterations for r in self._client.call_many(calls)]
        return np.asarray(max(counts) if counts else 0, dtype=np.int64)

    def _update(self, kind: str, value: Any) -> None:
        value = int(np.asarray(self._convert(value)))
        if kind == "assign_add":
            value += int(self._remote_read())
        elif kind == "assign_sub":
            value = int(self._remote_read()) - value
        calls = [
            PSCall(
                addr,
                task,
                "SetOptimizerState",
                pb.OptimizerState(
                    optimizer_id=self._optimizer_id, iterations=value, set_iterations=True
                ),
            )
            for task, addr in self._tasks
        ]
        self._client.call_many(calls)

    def _restore_value(self, value: np.ndarray) -> None:
        self._update("assign", value)

    def __repr__(self) -> str:
        return f"<IterationsVariable {self._name!r} of optimizer {self._optimizer_id}>"


class SlotVariable(RemoteVariable):
    """One optimizer slot (e.g. Adam's ``m``) of one variable, kept next to the variable's
    shards on the parameter servers."""

    def __init__(
        self,
        strategy: Any,
        client: PSClient,
        optimizer_id: str,
        variable: RemoteVariable,
        slot_name: str,
    ) -> None:
        super().__init__(
            strategy,
            None,
            f"{variable.name}/{slot_name}",
            variable.shape,
            variable.dtype,
            variable._shards,
            False,
        )
        self._client = client
        self._optimizer_id = optimizer_id
        self._slot_name = slot_name

    def _by_task(self) -> dict[tuple[int, str], list[str]]:
        by_task: dict[tuple[int, str], list[str]] = {}
        for s in self._shards:
            by_task.setdefault((s.task, s.address), []).append(s.key)
        return by_task

    def _remote_read(self) -> np.ndarray:
        by_task = self._by_task()
        calls = [
            PSCall(
                addr,
                task,
                "GetOptimizerState",
                pb.OptimizerStateRequest(optimizer_id=self._optimizer_id, keys=keys),
            )
            for (task, addr), keys in by_task.items()
        ]
        values: dict[str, np.ndarray] = {}
        for resp in self._client.call_many(calls):
            for sv in resp.slots:
                if sv.slot == self._slot_name:
                    values[sv.key] = wire.decode_tensor(sv.value)
        return join_rows([values[s.key] for s in self._shards])

    def _update(self, kind: str, value: Any) -> None:
        if kind != "assign":
            value = self._remote_read() + (1 if kind == "assign_add" else -1) * self._convert(value)
        value = self._convert(value)
        by_task: dict[tuple[int, str], list[pb.SlotValue]] = {}
        for s, part in zip(self._shards, split_rows(value, self._shards)):
            by_task.setdefault((s.task, s.address), []).append(
                pb.SlotValue(key=s.key, slot=self._slot_name, value=wire.encode_tensor(part))
            )
        calls = [
            PSCall(
                addr,
                task,
                "SetOptimizerState",
                pb.OptimizerState(optimizer_id=self._optimizer_id, slots=slots),
            )
            for (task, addr), slots in by_task.items()
        ]
        self._client.call_many(calls)

    def _restore_value(self, value: np.ndarray) -> None:
        self._update("assign", value)


# One machine: CentralStorageStrategy ----------------------------------------------------------------


class _CentralArrays:
    """What the strategies-layer optimizer indexes as ``var._arrays[replica]``.

    Replica 0's entry is the one copy of the variable. The optimizer updates every replica's
    entry with the same all-reduced gradient (it has no merge_call), so replicas 1..N-1 get
    scratch buffers that take those duplicate updates and are never read.
    """

    def __init__(self, central: np.ndarray, num_replicas: int) -> None:
        self.central = central
        self._n = num_replicas
        self._scratch: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> np.ndarray:
        if index == 0:
            return self.central
        if not 0 < index < self._n:
            raise IndexError(index)
        buf = self._scratch.get(index)
        if buf is None:
            buf = self._scratch[index] = self.central.copy()
        return buf

    def __iter__(self):
        return (self[i] for i in range(self._n))


class CentralVariable(MirroredVariable):
    """One copy of a variable in host memory (the parameter device) for every compute replica:
    every replica reads it, updates are applied to it once."""

    def __init__(
        self,
        strategy: Any,
        initial: np.ndarray,
        num_replicas: int,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
    ) -> None:
        super().__init__(strategy, [initial], name, trainable, aggregation, synchronization)
        self._arrays = _CentralArrays(self._arrays[0], num_replicas)  # type: ignore[assignment]
        self._values = (ComponentVariable(self, 0),)

    def _central(self) -> np.ndarray:
        return self._arrays.central  # type: ignore[attr-defined]

    @property
    def device(self) -> str:
        return self._strategy.extended.parameter_devices[0]

    def value(self) -> np.ndarray:
        view = self._central().view()
        view.flags.writeable = False
        return view

    def _live(self) -> np.ndarray:
        return self._central()

    def _read_cross_replica(self) -> np.ndarray:
        return self._central()

    def _apply(self, index: int, kind: str, value: np.ndarray) -> None:
        # Replica-context updates arrive once per replica, all with the combined value: the one
        # copy takes the first.
        if index == 0:
            super()._apply(0, kind, value)

    def __repr__(self) -> str:
        return (
            f"<CentralVariable {self._name!r} shape={self.shape} dtype={self.dtype} on "
            f"{self.device}>"
        )


def to_numpy_gradient(grad: Any, var: Any) -> np.ndarray:
    arr = _tensors.to_numpy(grad, f"gradient of {var.name!r}")
    if arr.shape != tuple(var.shape):
        raise ValueError(
            f"gradient of {var.name!r} has shape {arr.shape}, the variable has "
            f"shape {tuple(var.shape)}"
        )
    return _tensors.contiguous(arr.astype(var.dtype, copy=False))
