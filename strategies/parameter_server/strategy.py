"""ParameterServerStrategy: variables on parameter servers, steps on workers.

With a cluster (TF_CONFIG with "ps" and "worker" jobs; this program is the chief, the
coordinator), variables created in ``scope()`` are placed on the ps tasks round-robin (or split
into shards by a ``variable_partitioner``), and a :class:`ClusterCoordinator` schedules
functions on the workers. ``update_mode`` chooses how the parameter servers apply gradients:

- ``"async"`` (default, tf's behaviour): each worker's gradients are applied as they arrive;
  the optimizer state (iterations, slots) lives on the ps tasks.
- ``"sync"``: a ps task waits for one gradient from each of the N workers for a step,
  aggregates them (the optimizer's ``gradient_aggregation``: mean by default) and applies them
  once; the workers' pushes return after that, so every worker then reads the new version.

Without a cluster, ``ParameterServerStrategy()`` trains on one machine the way tf's
CentralStorageStrategy does: one copy of every variable in host memory, compute on local
replicas (threads), gradients reduced to the parameter device and applied there.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pycollective import config as _config

from .. import _context
from ..backend import LocalBackend
from ..cluster_resolver import ClusterResolver, ClusterSpec, TFConfigClusterResolver
from ..cross_device_ops import AlgorithmAllReduce, ReductionToOneDevice
from ..mirrored import canonical_cpu_device, resolve_devices
from ..optimizers import Optimizer
from ..strategy import Strategy, StrategyExtended
from ..variables import (
    DistributedVariable,
    SyncOnReadVariable,
    VariableAggregation,
    VariableSynchronization,
)
from . import ps_pb2 as pb
from . import wire
from .client import PSCall, PSClient
from .errors import ps_task
from .partitioners import Partitioner, shard_rows
from .variables import (
    CentralVariable,
    CoordinatorStore,
    IterationsVariable,
    ParameterServerVariable,
    RemoteVariable,
    Shard,
    ShardedVariable,
    SlotVariable,
    assign_calls,
    push_calls,
)

logger = logging.getLogger("pycollective.strategies")

UPDATE_MODES = ("async", "sync")
DEFAULT_RPC_TIMEOUT_S = 30.0
_NAME_RE = re.compile(r"[^A-Za-z0-9_.\-/]")
# Optimizer attributes that belong to the coordinator's bookkeeping, not to its arithmetic.
_OPTIMIZER_BOOKKEEPING = (
    "_strategy",
    "_scope_strategy",
    "_iterations",
    "_slots",
    "_slot_order",
    "_lock",
)


def _is_cluster(spec: ClusterSpec) -> bool:
    return bool(spec) and "ps" in spec.jobs and spec.num_tasks("ps") > 0


class ParameterServerStrategy(Strategy):
    """A multi-worker tf.distribute strategy with parameter servers.

    Args:
        cluster_resolver: a ClusterResolver (default: TFConfigClusterResolver, which reads
            TF_CONFIG). With "ps" and "worker" jobs this process is the coordinator (the chief);
            without a cluster the strategy runs on this machine alone (CentralStorageStrategy).
        variable_partitioner: a Partitioner (FixedShardsPartitioner, MinSizePartitioner,
            MaxSizePartitioner) or any callable ``(shape, dtype) -> [shards, 1, ...]``; variables
            created in ``scope()`` are split along axis 0 into that many shards
            (ShardedVariable). None: no partitioning.
        update_mode: ``"async"`` (default) or ``"sync"``: see the module docstring.
        rpc_timeout: deadline in seconds of every call to a parameter server (default 30);
            a dead ps task is reported within it.
        sync_timeout: how long a synchronous push may wait for the other workers' gradients
            (default: ``PYCOLLECTIVE_TIMEOUT``).
        closure_timeout: how long one scheduled function may run on a worker before the worker
            counts as failed (default: ``PYCOLLECTIVE_TIMEOUT``).
        token: the cluster token (default PYCOLLECTIVE_TOKEN).
        compute_devices: one machine only: the local replicas (default
            ``PYCOLLECTIVE_CPU_REPLICAS``, else one per CPU core).
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        variable_partitioner: Partitioner | Callable[..., Any] | None = None,
        *,
        update_mode: str = "async",
        rpc_timeout: float | None = None,
        sync_timeout: float | None = None,
        closure_timeout: float | None = None,
        token: str | None = None,
        compute_devices: Sequence[str] | None = None,
    ) -> None:
        if update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode must be one of {UPDATE_MODES}, got {update_mode!r}")
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(
                "variable_partitioner must be a Partitioner (e.g. "
                "FixedShardsPartitioner(2)) or a callable (shape, dtype) -> list"
            )
        resolver = cluster_resolver if cluster_resolver is not None else TFConfigClusterResolver()
        if isinstance(resolver, TFConfigClusterResolver):
            resolver.validate()
        self._cluster_resolver = resolver
        self._variable_partitioner = variable_partitioner
        self.update_mode = update_mode
        spec = resolver.cluster_spec()
        if _is_cluster(spec):
            if "worker" not in spec.jobs or spec.num_tasks("worker") == 0:
                raise ValueError(
                    f"ParameterServerStrategy needs 'worker' tasks in the cluster, "
                    f"got jobs {spec.jobs}"
                )
            task_type = resolver.task_type
            if task_type not in (None, "chief"):
                raise ValueError(
                    f"this process is task {task_type!r} #{resolver.task_id}: ps and worker "
                    "tasks run Server(cluster_resolver).join(); only the chief (the "
                    "coordinator) creates ParameterServerStrategy"
                )
            extended: StrategyExtended = ParameterServerStrategyExtended(
                self,
                spec,
                variable_partitioner,
                update_mode,
                rpc_timeout=DEFAULT_RPC_TIMEOUT_S if rpc_timeout is None else rpc_timeout,
                sync_timeout=_config.default_timeout() if sync_timeout is None else sync_timeout,
                closure_timeout=_config.default_timeout()
                if closure_timeout is None
                else closure_timeout,
                token=wire.resolve_token(token),
            )
            logger.info(
                "ParameterServerStrategy: %d ps, %d workers, %s updates",
                spec.num_tasks("ps"),
                spec.num_tasks("worker"),
                update_mode,
            )
        elif spec and not _is_cluster(spec):
            raise ValueError(
                f"ParameterServerStrategy needs 'ps' tasks in the cluster, got jobs "
                f"{spec.jobs}; without TF_CONFIG it trains on this machine alone"
            )
        else:
            extended = CentralStorageExtended(self, resolve_devices(compute_devices))
            logger.info(
                "ParameterServerStrategy without a cluster: %d local replicas, variables on %s",
                len(extended.worker_devices),
                extended.parameter_devices[0],
            )
        super().__init__(extended)

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """Returns the cluster resolver associated with this strategy."""
        return self._cluster_resolver

    @property
    def is_cluster(self) -> bool:
        """Whether variables live on parameter-server tasks (False: one machine)."""
        return isinstance(self.extended, ParameterServerStrategyExtended)

    def __repr__(self) -> str:
        if self.is_cluster:
            ext = self.extended
            return (
                f"<ParameterServerStrategy {ext._num_ps} ps, {ext._num_workers_in_cluster} "
                f"workers, {self.update_mode}>"
            )
        return f"<ParameterServerStrategy on one machine, {self.num_replicas_in_sync} replicas>"


class CentralStorageStrategy(Strategy):
    """A one-machine strategy that puts all variables on a single device (host memory): compute
    on local replicas, gradients reduced to the parameter device and applied there once.

    Args:
        compute_devices: the local replicas, e.g. ``["/cpu:0", "/cpu:1"]`` (default
            ``PYCOLLECTIVE_CPU_REPLICAS``, else one per CPU core).
        parameter_device: where variables live (host memory; only CPU is accepted).
    """

    def __init__(
        self, compute_devices: Sequence[str] | None = None, parameter_device: str | None = None
    ) -> None:
        if parameter_device is not None and "gpu" in parameter_device.lower():
            raise NotImplementedError(
                "parameter_device must be a CPU device: the strategies keep their variables "
                "in host memory"
            )
        super().__init__(CentralStorageExtended(self, resolve_devices(compute_devices)))


# One machine ----------------------------------------------------------------------------------------


class CentralStorageExtended(StrategyExtended):
    """Compute replicas are threads; every variable has one copy in host memory; replica
    gradients are reduced to it (ReductionToOneDevice: reduce to one, then share)."""

    def __init__(self, container: Strategy, devices: Sequence[str]) -> None:
        cross_device_ops = ReductionToOneDevice()
        backend = LocalBackend(len(devices), cross_device_ops.algorithm)
        super().__init__(container, backend, cross_device_ops, devices)
        self._parameter_device = canonical_cpu_device(0)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (self._parameter_device,)

    def _create_variable(
        self,
        initial: np.ndarray,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
        broadcast_initial: bool = True,
    ) -> DistributedVariable:
        if synchronization == VariableSynchronization.ON_READ:
            arrays = [
                np.array(initial, copy=True, order="C") for _ in range(self._num_local_replicas)
            ]
            var: DistributedVariable = SyncOnReadVariable(
                self._container_strategy(), arrays, name, trainable, aggregation, synchronization
            )
        else:
            var = CentralVariable(
                self._container_strategy(),
                np.array(initial, copy=True, order="C"),
                self._num_local_replicas,
                name,
                trainable,
                aggregation,
                synchronization,
            )
        self._created.add(var)
        return var


# Cluster ----------------------------------------------------------------------------------------------


class ParameterServerStrategyExtended(StrategyExtended):
    """The coordinator's side of a parameter-server cluster: variable placement, the
    parameter-server client, optimizer registration.

    ``push_gradients(optimizer, grads_and_vars)`` applies gradients from the coordinator
    itself (what a worker's ``optimizer.apply_gradients`` does).
    """

    def __init__(
        self,
        container: Strategy,
        spec: ClusterSpec,
        partitioner: Callable[..., Any] | None,
        update_mode: str,
        *,
        rpc_timeout: float,
        sync_timeout: float,
        closure_timeout: float,
        token: str,
    ) -> None:
        super().__init__(
            container,
            LocalBackend(1),
            AlgorithmAllReduce("auto"),
            ("/job:chief/replica:0/task:0/device:CPU:0",),
        )
        self._spec = spec
        self._partitioner = partitioner
        self.update_mode = update_mode
        self.rpc_timeout = float(rpc_timeout)
        self.sync_timeout = float(sync_timeout)
        self.closure_timeout = float(closure_timeout)
        self._token = token
        self.payload_key = wire.payload_key(token)
        self.session = secrets.token_hex(6)
        self.client = PSClient(token, self.rpc_timeout)
        self._store = CoordinatorStore(self.client)
        self._ps = [(i, spec.task_address("ps", i)) for i in spec.task_indices("ps")]
        self._workers = [(i, spec.task_address("worker", i)) for i in spec.task_indices("worker")]
        self._lock = threading.RLock()
        self._next_ps = itertools.count()
        self._counter = itertools.count()
        self._variables: list[RemoteVariable] = []
        self._optimizers: dict[int, tuple[Optimizer, str]] = {}
        self._colocate: list[RemoteVariable] = []
        self._sync_replicas = len(self._workers)

    # Topology -------------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self._token

    @property
    def ps_tasks(self) -> list[tuple[int, str]]:
        """``[(task index, "host:port"), ...]`` of the parameter servers."""
        return list(self._ps)

    @property
    def worker_tasks(self) -> list[tuple[int, str]]:
        """``[(task index, "host:port"), ...]`` of the workers."""
        return list(self._workers)

    @property
    def _num_ps(self) -> int:
        return len(self._ps)

    @property
    def _num_workers_in_cluster(self) -> int:
        return len(self._workers)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return tuple(f"{ps_task(i)}/device:CPU:0" for i, _ in self._ps)

    @property
    def _num_replicas_in_sync(self) -> int:
        """Replicas whose gradients are aggregated into one update: every worker in sync
        mode, one in async mode."""
        return len(self._workers) if self.update_mode == "sync" else 1

    @property
    def should_checkpoint(self) -> bool:
        return True

    @property
    def experimental_between_graph(self) -> bool:
        return False

    @property
    def variables(self) -> list[RemoteVariable]:
        """Every variable created in this strategy's scope, in creation order."""
        with self._lock:
            return list(self._variables)

    # Not on the coordinator -------------------------------------------------------------------------

    def _call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        raise RuntimeError(
            "with parameter servers, strategy.run runs on the workers: call it "
            "inside a function scheduled with ClusterCoordinator.schedule"
        )

    # Variables --------------------------------------------------------------------------------------

    def colocate_vars_with(self, colocate_with_variable: Any) -> contextlib.AbstractContextManager:
        """Variables created in this scope are placed on the ps task of
        ``colocate_with_variable`` (and not partitioned)."""
        if not isinstance(colocate_with_variable, RemoteVariable):
            raise TypeError("colocate_vars_with expects a variable of this strategy")

        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            self._colocate.append(colocate_with_variable)
            try:
                yield
            finally:
                self._colocate.pop()

        return scope()

    def _num_shards(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        if self._partitioner is None or not shape or self._colocate:
            return 1
        result = self._partitioner(shape, dtype)
        try:
            parts = [int(p) for p in result]
        except TypeError:
            raise TypeError(
                f"variable_partitioner returned {result!r}; expected a list with "
                "the number of partitions per axis, e.g. [2, 1]"
            ) from None
        if len(parts) != len(shape) or any(p < 1 for p in parts) or any(p != 1 for p in parts[1:]):
            raise ValueError(
                f"variable_partitioner returned {parts} for shape {shape}: only "
                "axis 0 can be partitioned (e.g. [2, 1])"
            )
        return max(1, min(parts[0], shape[0]))

    def _create_variable(
        self,
        initial: np.ndarray,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
        broadcast_initial: bool = True,
    ) -> DistributedVariable:
        if not broadcast_initial:
            # Optimizer state made by Optimizer._bind/_create_slots before the optimizer was
            # registered (e.g. restoring a checkpoint before the first schedule): keep it on the
            # coordinator; registration moves it to the parameter servers.
            return super()._create_variable(
                initial, name, trainable, aggregation, synchronization, broadcast_initial=False
            )
        initial = np.ascontiguousarray(initial)
        if initial.dtype.kind not in "biufc":
            raise TypeError(
                f"variable {name!r}: parameter servers hold numeric tensors, got "
                f"dtype {initial.dtype}"
            )
        shape = initial.shape
        with self._lock:
            n = self._num_shards(shape, initial.dtype)
            index = next(self._counter)
            key = f"{self.session}/{index}/{_NAME_RE.sub('_', name)}"
            if self._colocate:
                tasks = [self._colocate[-1]._shards[0].task]
            else:
                tasks = [self._ps[next(self._next_ps) % len(self._ps)][0] for _ in range(n)]
            address = dict(self._ps)
            if n == 1:
                shards = [
                    Shard(tasks[0], address[tasks[0]], key, 0, shape[0] if shape else 0, shape)
                ]
            else:
                shards = [
                    Shard(
                        t, address[t], f"{key}/part_{i}", start, stop, (stop - start,) + shape[1:]
                    )
                    for i, (t, (start, stop)) in enumerate(zip(tasks, shard_rows(shape[0], n)))
                ]
            cls = ShardedVariable if n > 1 else ParameterServerVariable
            var = cls(
                self._container_strategy(),
                self._store,
                name,
                shape,
                initial.dtype,
                shards,
                trainable,
                aggregation,
                synchronization,
            )
            self.client.call_many(assign_calls(var, "assign", initial, create=True))
            self._variables.append(var)
            self._created.add(var)
        return var

    def read_var(self, v: DistributedVariable) -> np.ndarray:
        return v.read_value()

    # Optimizers -------------------------------------------------------------------------------------

    def register_optimizer(self, optimizer: Optimizer) -> str:
        """Makes ``optimizer``'s update arithmetic available on every ps task and moves its
        state (iterations, slots of every trainable variable) there; returns its id. Done
        automatically when a scheduled function refers to the optimizer."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"expected an Optimizer of pycollective.strategies, got {type(optimizer).__name__}"
            )
        strategy = self._container_strategy()
        with self._lock:
            entry = self._optimizers.get(id(optimizer))
            if entry is None:
                bound = optimizer._strategy
                if (
                    bound is not None
                    and bound is not strategy
                    and bound is not _context.default_strategy()
                ):
                    raise ValueError(
                        f"optimizer {optimizer.name!r} is used with {bound!r}; "
                        f"create one optimizer per strategy"
                    )
                optimizer_id = f"{self.session}/opt{len(self._optimizers)}"
                self.client.call_many(self._register_calls(optimizer, optimizer_id))
                with optimizer._lock:
                    previous = optimizer._iterations
                    optimizer._strategy = strategy
                    optimizer._iterations = IterationsVariable(
                        strategy,
                        self.client,
                        optimizer_id,
                        f"{optimizer.name}/iterations",
                        self._ps,
                    )
                if previous is not None:
                    optimizer._iterations.assign(previous.read_value())
                entry = self._optimizers[id(optimizer)] = (optimizer, optimizer_id)
            optimizer_id = entry[1]
            self._adopt_slots(optimizer, optimizer_id)
        return optimizer_id

    def _register_calls(self, optimizer: Optimizer, optimizer_id: str) -> list[PSCall]:
        """RegisterOptimizer for every ps task: the optimizer's class and hyperparameters,
        signed (the ps rebuilds it and runs its update arithmetic)."""
        state = {k: v for k, v in optimizer.__dict__.items() if k not in _OPTIMIZER_BOOKKEEPING}
        body, tensors = wire.dumps((type(optimizer), state))
        spec = wire.sign(self.payload_key, "optimizer", body, tensors)
        return [
            PSCall(
                addr,
                task,
                "RegisterOptimizer",
                pb.RegisterOptimizerRequest(
                    optimizer_id=optimizer_id, spec=spec, sync_replicas=self._sync_replicas
                ),
            )
            for task, addr in self._ps
        ]

    def reregister_optimizers(self) -> None:
        """Registers every optimizer on every ps task again: a ps task that restarted lost
        them (their iterations and slots come back with ``Checkpoint.restore``; a task that
        kept its state keeps it)."""
        with self._lock:
            calls = [
                call
                for optimizer, optimizer_id in self._optimizers.values()
                for call in self._register_calls(optimizer, optimizer_id)
            ]
        if calls:
            self.client.call_many(calls)

    def _adopt_slots(self, optimizer: Optimizer, optimizer_id: str) -> None:
        """Slot handles for every trainable variable (the ps creates the slots on first use);
        slot values made on the coordinator before registration move to the ps."""
        strategy = self._container_strategy()
        for var in self._variables:
            if not var.trainable or not optimizer._slot_names:
                continue
            with optimizer._lock:
                slots = optimizer._slots.setdefault(id(var), {})
                moved = []
                for slot_name in optimizer._slot_names:
                    existing = slots.get(slot_name)
                    if isinstance(existing, SlotVariable):
                        continue
                    handle = SlotVariable(strategy, self.client, optimizer_id, var, slot_name)
                    slots[slot_name] = handle
                    if existing is None:
                        optimizer._slot_order.append((var, slot_name, handle))
                    else:
                        optimizer._slot_order[:] = [
                            (v, n, handle if s is existing else s)
                            for v, n, s in optimizer._slot_order
                        ]
                        moved.append((handle, existing.read_value()))
            for handle, value in moved:
                handle.assign(value)

    def optimizer_id(self, optimizer: Optimizer) -> str | None:
        entry = self._optimizers.get(id(optimizer))
        return entry[1] if entry else None

    def set_sync_replicas(self, replicas: int) -> None:
        """How many workers' gradients make one synchronous step (the coordinator lowers it
        while workers are down and raises it when they rejoin)."""
        replicas = max(1, int(replicas))
        with self._lock:
            if replicas == self._sync_replicas:
                return
            self._sync_replicas = replicas
        if self.update_mode != "sync":
            return
        try:
            self.client.call_many(
                [
                    PSCall(
                        addr,
                        task,
                        "SetSyncReplicas",
                        pb.SetSyncReplicasRequest(replicas=replicas),
                        min(self.rpc_timeout, 5.0),
                    )
                    for task, addr in self._ps
                ]
            )
        except Exception as exc:  # noqa: BLE001 - a dead ps is reported by the next step
            logger.warning(
                "could not tell the parameter servers about %d workers: %s", replicas, exc
            )

    def push_gradients(self, optimizer: Optimizer, grads_and_vars: Any) -> int:
        """Applies gradients from the coordinator with ``optimizer``'s update arithmetic on
        the parameter servers (asynchronously); returns the optimizer's iterations."""
        optimizer_id = self.register_optimizer(optimizer)
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        responses = self.client.call_many(push_calls(optimizer_id, pairs, -1, False))
        return max((r.iterations for r in responses), default=0)
