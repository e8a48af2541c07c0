"""TPUStrategy: synchronous training compiled by XLA (through JAX) into one SPMD program.

The replicas are the devices of a one-axis mesh (axis ``"replica"``) over every device of the
job (:class:`.cluster_resolver.TPUClusterResolver`). ``run(fn)`` traces ``fn`` once per input
signature into ``jax.jit(jax.shard_map(...))`` (:mod:`.step`): variables go in and come out as
replicated arrays, per-replica arguments as arrays sharded over the mesh, and the all-reduce of
gradients is an XLA collective inside the program -- on TPU the interconnect (ICI), on GPUs
NCCL, on host CPU devices XLA's CPU collectives (gloo across processes).
"""

from __future__ import annotations

import collections
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _context, _nest, _tensors
from ..communication import CommunicationOptions
from ..input_lib import DistributedDatasetsFromFunction, InputOptions, InputReplicationMode
from ..reduce_util import ReduceOp, parse_reduce_op
from ..strategy import Strategy, StrategyExtended, non_distributed_reduce_rule
from ..values import DistributedValues, Mirrored, PerReplica
from ..variables import DistributedVariable, VariableAggregation, VariableSynchronization
from . import _jax, reductions, step
from .cluster_resolver import TPUClusterResolver
from .input_lib import TPUDistributedDataset
from .program import Program, canonical, host_array, prepare, same_shape_runs
from .values import PaddedPerReplica, TPUPerReplica
from .variables import TPUMirroredVariable, TPUSyncOnReadVariable, register_pytree

logger = logging.getLogger("pycollective.strategies")

#: compiled programs kept per strategy (least recently used dropped first)
PROGRAM_CACHE_SIZE = 64


class TPUExtended(StrategyExtended):
    """Implementation of TPUStrategy (its ``extended``)."""

    def __init__(
        self,
        container_strategy: TPUStrategy,
        resolver: TPUClusterResolver,
        devices: Sequence[Any],
        steps_per_execution: int,
    ) -> None:
        jax = _jax.require()
        from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

        register_pytree()
        self._resolver = resolver
        self._jax_devices = list(devices)
        self._mesh = Mesh(np.array(self._jax_devices), (step.AXIS,), axis_types=(AxisType.Auto,))
        self._replicated = NamedSharding(self._mesh, PartitionSpec())
        self._sharded = NamedSharding(self._mesh, PartitionSpec(step.AXIS))
        me = jax.process_index()
        local = [i for i, d in enumerate(self._jax_devices) if d.process_index == me]
        if not local:
            raise ValueError(
                f"process {me} has none of the {len(self._jax_devices)} assigned "
                "devices; every process of the job must own some replicas (assign "
                "devices of every process, or run fewer processes)"
            )
        if local != list(range(local[0], local[0] + len(local))):
            raise ValueError(
                "each process's devices must be a contiguous run of the device "
                f"assignment; process {me} has positions {local}"
            )
        self._local_positions = local
        # No collective backend: the base's shared state only (devices, options, variables
        # created, the run lock).
        self._init_common(
            container_strategy,
            [
                f"/job:{resolver.task_type}/replica:0/task:{d.process_index}/"
                f"device:{d.platform.upper()}:{d.id}"
                for d in self._jax_devices
                if d.process_index == me
            ],
            None,
        )
        self._variables: list[weakref.ref[TPUMirroredVariable]] = []
        self._variables_version = 0
        self._programs: collections.OrderedDict[Any, Program] = collections.OrderedDict()
        # Held while a program runs (it donates the variables' buffers) and by cross-replica
        # reads and updates of the variables on the host: one thread's update never sees
        # another's step half done.
        self._device_lock = threading.RLock()
        self._warned_unmasked = False
        self.steps_per_execution = steps_per_execution

    # Topology -----------------------------------------------------------------------------------

    @property
    def backend(self) -> Any:
        raise AttributeError(
            "TPUStrategy has no pycollective collective backend: its "
            "collectives are XLA's, compiled into the step"
        )

    @property
    def cross_device_ops(self) -> None:
        return None

    @property
    def mesh(self) -> Any:
        """The ``jax.sharding.Mesh`` of all replicas (one axis, ``"replica"``)."""
        return self._mesh

    @property
    def _num_local_replicas(self) -> int:
        return len(self._local_positions)

    @property
    def _num_workers(self) -> int:
        return _jax.require().process_count()

    @property
    def _worker_index(self) -> int:
        return _jax.require().process_index()

    @property
    def _first_replica_id(self) -> int:
        return self._local_positions[0]

    @property
    def _num_replicas_in_sync(self) -> int:
        return len(self._jax_devices)

    @property
    def experimental_require_static_shapes(self) -> bool:
        return True

    @property
    def steps_per_execution(self) -> int:
        """How many steps ``TPUStrategy.run_steps`` runs per compiled program (``lax.scan``
        over a block of batches), like Keras's ``steps_per_execution``. Settable."""
        return self._steps_per_execution

    @steps_per_execution.setter
    def steps_per_execution(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"steps_per_execution must be a positive integer, got {value!r}")
        self._steps_per_execution = value

    # Variables ----------------------------------------------------------------------------------

    def _replicate(self, value: Any) -> Any:
        """A host value as an array replicated on every device of the mesh."""
        jax = _jax.require()
        arr = np.asarray(_tensors.to_numpy(value))
        return jax.device_put(
            arr.astype(jax.dtypes.canonicalize_dtype(arr.dtype), copy=False), self._replicated
        )

    def _create_variable(
        self,
        initial: np.ndarray,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
        broadcast_initial: bool = True,
    ) -> DistributedVariable:
        initial = np.array(initial, copy=True, order="C")
        if broadcast_initial and self._num_workers > 1:
            # Processes may compute different initial values (an unseeded random init): every
            # process takes process 0's, as MultiWorkerMirroredStrategy takes the chief's.
            from jax.experimental import multihost_utils

            initial = np.asarray(multihost_utils.broadcast_one_to_all(initial), initial.dtype)
        cls = (
            TPUSyncOnReadVariable
            if synchronization == VariableSynchronization.ON_READ
            else TPUMirroredVariable
        )
        var = cls(
            self._container_strategy(),
            initial,
            name,
            trainable,
            aggregation,
            synchronization,
        )
        self._created.add(var)
        self._variables.append(weakref.ref(var))
        self._variables_version += 1
        return var

    def _live_variables(self) -> list[TPUMirroredVariable]:
        alive = [v for v in (r() for r in self._variables) if v is not None]
        if len(alive) != len(self._variables):
            self._variables = [weakref.ref(v) for v in alive]
            self._variables_version += 1
        return alive

    def _compiled_apply_gradients(
        self,
        opt: Any,
        grads: list[Any],
        variables: list[DistributedVariable],
        skip_aggregation: bool,
    ) -> None:
        """Optimizer.apply_gradients for this strategy's variables (called by the optimizer)."""
        for v in variables:
            if not isinstance(v, TPUMirroredVariable):
                raise TypeError(f"apply_gradients: {v.name!r} is not a TPUStrategy variable")
        if step.tracing_for(self._container_strategy()):
            step.apply_gradients(
                self._container_strategy(), opt, grads, variables, skip_aggregation
            )
            return
        # Cross-replica context: one compiled step; PerReplica gradients are reduced by the
        # optimizer's aggregation, plain ones are applied as they are (as MirroredStrategy).
        distributed = tuple(isinstance(g, DistributedValues) for g in grads)
        self._container_strategy().run(
            _apply_in_step,
            args=(opt, list(grads), tuple(variables), distributed, bool(skip_aggregation)),
        )

    def update(
        self,
        var: DistributedVariable,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
        """Runs ``fn(var, *args, **kwargs)`` once: the variable is one replicated array, so an
        update through it reaches every replica."""
        self._require_cross_replica("update")
        with self._device_lock:
            return fn(var, *args, **(kwargs or {}))

    def value_container(self, value: Any) -> Any:
        return value

    # Cross-replica reductions -------------------------------------------------------------------

    def reduce_to(
        self,
        reduce_op: Any,
        value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduces ``value`` across replicas (an XLA reduction on the devices); the result is
        replicated, so every destination has it."""
        self._require_cross_replica("reduce_to")
        return self._container_strategy().reduce(reduce_op, value, axis=None)

    def batch_reduce_to(
        self,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        self._require_cross_replica("batch_reduce_to")
        return [self.reduce_to(reduce_op, v, d) for v, d in value_destination_pairs]

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        self._require_cross_replica("broadcast_to")
        return self._replicate(tensor)

    def _global(self, value: Any) -> Any:
        """A per-replica value as one global array ``(replicas, *shape)``."""
        if isinstance(value, TPUPerReplica):
            return value.global_array
        comps = [host_array(c) for c in value.values]
        shapes = {c.shape for c in comps}
        if len(shapes) != 1:
            raise ValueError(
                f"per-replica values of different shapes {sorted(shapes)} cannot "
                "be reduced or gathered by TPUStrategy (a compiled program has "
                "static shapes); pad them to one shape first"
            )
        return self._shard_rows([c[None] for c in comps])

    def _valid_rows(self, value: Any) -> Any:
        """Each replica's number of real rows of a padded per-replica batch (a global int32
        array ``(replicas,)``), or None when ``value`` is not padded."""
        if isinstance(value, TPUPerReplica):
            return value.valid_rows
        if isinstance(value, PaddedPerReplica):
            return self._shard_rows([np.array([n], np.int32) for n in value.valid_rows])
        return None

    def _shard_rows(self, local_rows: list[Any]) -> Any:
        """A global array ``(replicas, ...)`` from this process's replicas' rows (each with a
        leading axis of 1)."""
        jax = _jax.require()
        if self._num_local_replicas == self._num_replicas_in_sync and all(
            isinstance(r, np.ndarray) for r in local_rows
        ):
            # one process: one transfer call for every device (much less Python per step)
            return jax.device_put(canonical(np.concatenate(local_rows)), self._sharded)
        mine = [d for d in self._jax_devices if d.process_index == jax.process_index()]
        shape = (self._num_replicas_in_sync,) + tuple(local_rows[0].shape[1:])
        parts = [jax.device_put(canonical(r), d) for r, d in zip(local_rows, mine)]
        return jax.make_array_from_single_device_arrays(shape, self._sharded, parts)

    # Running steps ------------------------------------------------------------------------------

    def _run_replicas(
        self,
        strategy: Strategy,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        return self._execute(fn, [(args, kwargs)], scan=False)

    def _execute(
        self,
        fn: Callable[..., Any],
        inputs: list[tuple[tuple[Any, ...], dict[str, Any]]],
        scan: bool,
    ) -> Any:
        """Runs ``fn`` on every replica for each of ``inputs`` (one step each; ``scan``: all of
        them in one program) and returns the last step's results."""
        prepared = prepare(self, inputs, scan)
        variables = self._live_variables()
        key = (fn, prepared.key, self._variables_version, len(inputs) if scan else None)
        program = self._programs.get(key)
        if program is None and scan:
            # Variables that a first step creates (optimizer slots) must exist before the
            # scan's carry is fixed: trace one plain step first, without running it.
            first = prepare(self, inputs[:1], False)
            Program(self, fn, first, variables, False).trace_only(first)
            variables = self._live_variables()
            key = (fn, prepared.key, self._variables_version, len(inputs))
            program = self._programs.get(key)
        if program is None:
            program = Program(self, fn, prepared, variables, scan)
            if not program.compile(prepared):
                # The trace created variables (optimizer slots on first use): compile once,
                # with them as inputs and outputs.
                variables = self._live_variables()
                key = (fn, prepared.key, self._variables_version, len(inputs) if scan else None)
                program = Program(self, fn, prepared, variables, scan)
                if not program.compile(prepared):
                    raise RuntimeError(
                        f"{getattr(fn, '__name__', fn)!r} creates new variables "
                        "each time it is traced; create them in scope()"
                    )
        with self._device_lock:
            outputs = program(prepared)
        if (
            prepared.padded
            and not program.record.get("valid_rows_read")
            and not self._warned_unmasked
        ):
            self._warned_unmasked = True
            warnings.warn(
                f"{getattr(fn, '__name__', 'fn')}: a per-replica batch was padded with zero "
                "rows to one static shape (an uneven batch), and the step never read "
                "get_replica_context().experimental_valid_rows: a loss or metric over the "
                "whole batch counts the padding rows as data. Mask them (rows below "
                "experimental_valid_rows are real), or drop the uneven last batch",
                UserWarning,
                stacklevel=5,
            )
        self._programs[key] = program
        self._programs.move_to_end(key)
        while len(self._programs) > PROGRAM_CACHE_SIZE:
            self._programs.popitem(last=False)
        return outputs


def _apply_in_step(
    opt: Any,
    grads: list[Any],
    variables: tuple[Any, ...],
    distributed: tuple[bool, ...],
    skip: bool,
) -> None:
    # A PerReplica gradient is reduced by the optimizer's aggregation (unless ``skip``). A
    # plain gradient is the same value on every replica; it enters the step as a per-replica
    # (varying) copy, and its MEAN is that value again, now known to be the same everywhere.
    ctx = _context.get_replica_context()
    reduced = [
        ctx.all_reduce(ReduceOp.MEAN, g)
        if not d
        else g
        if skip
        else ctx.all_reduce(opt.gradient_aggregation, g)
        for g, d in zip(grads, distributed)
    ]
    opt.apply_gradients(zip(reduced, variables), skip_gradients_aggregation=True)


class TPUStrategy(Strategy):
    """Synchronous training on TPUs and TPU Pods -- or on any XLA devices -- through JAX.

    Every replica runs the same compiled XLA program (SPMD): ``run(fn)`` traces ``fn`` with JAX
    once per input signature and compiles it into one program over all replicas, with the
    cross-replica all-reduce inside it. Variables created in ``scope()`` are device arrays
    replicated on every replica; the optimizers (SGD, momentum, Adam) update them inside the
    compiled step.

    Args:
        tpu_cluster_resolver: a TPUClusterResolver; default ``TPUClusterResolver()`` (the
            devices of this job; in a multi-process job it joins the processes with
            ``jax.distributed.initialize`` first).
        experimental_device_assignment: which devices are replicas: None (all of them), a
            number ``n`` (the first n devices of the job, in process order), or a
            sequence of ``jax.Device``. tf's ``DeviceAssignment`` objects are accepted when
            they have ``num_replicas`` (the first that many devices).
        experimental_spmd_xla_partitioning: model parallelism inside a replica; not
            supported (must be False).
        steps_per_execution: steps per compiled program in :meth:`run_steps` (default 1; also
            ``strategy.extended.steps_per_execution``).

    A replica function must be traceable by JAX (jax.numpy on its arguments and variables);
    its Python side effects happen once per compilation, at trace time, not once per step.
    See docs/strategies.md ("TPUStrategy").

    Raises:
        ImportError: JAX is not installed (``pip install "pycollective[tpu]"``).
    """

    def __init__(
        self,
        tpu_cluster_resolver: TPUClusterResolver | None = None,
        experimental_device_assignment: Any = None,
        experimental_spmd_xla_partitioning: bool = False,
        steps_per_execution: int = 1,
    ) -> None:
        _jax.require()
        if experimental_spmd_xla_partitioning:
            raise NotImplementedError(
                "experimental_spmd_xla_partitioning (model parallelism "
                "within a replica) is not supported: every replica holds "
                "a full copy of each variable"
            )
        resolver = (
            tpu_cluster_resolver if tpu_cluster_resolver is not None else TPUClusterResolver()
        )
        if not isinstance(resolver, TPUClusterResolver):
            raise TypeError(
                f"tpu_cluster_resolver must be a TPUClusterResolver, got {type(resolver).__name__}"
            )
        self._resolver = resolver
        devices = _assign_devices(resolver.devices, experimental_device_assignment)
        super().__init__(TPUExtended(self, resolver, devices, steps_per_execution))
        logger.info(
            "TPUStrategy: %d replicas on %s devices (%d here)",
            len(devices),
            resolver.platform,
            self._extended._num_local_replicas,
        )

    @property
    def cluster_resolver(self) -> TPUClusterResolver:
        """Returns the cluster resolver associated with this strategy."""
        return self._resolver

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """Runs ``fn`` on every replica as one compiled XLA program.

        ``fn`` is traced by JAX (once per signature: the function object, the shapes and
        dtypes of array arguments, the values of other Python arguments, and the set of
        variables) and compiled with the replica-context collectives and variable updates
        inside. PerReplica arguments give each replica its component (uneven batches are
        padded, see ``experimental_valid_rows``); arrays are passed to every replica; other
        Python values are constants of the program. Returns PerReplica values (one global
        array on the devices, see ``TPUPerReplica``), or plain values with one replica.

        Raises:
            StepTraceError: ``fn`` uses a traced value where Python needs a concrete one.
        """
        return self._extended._call_for_each_replica(fn, args, kwargs or {})

    def run_steps(
        self, fn: Callable[..., Any], iterator: Iterator[Any], steps: int | None = None
    ) -> Any:
        """Runs ``fn(element)`` for the next ``steps`` elements of ``iterator`` (default
        ``extended.steps_per_execution``) in one compiled program: a ``lax.scan`` over the
        block, as Keras's ``steps_per_execution``. Returns the last step's results, or None
        when the iterator was already exhausted. A block cut short by the end of the data, or
        elements of another shape (an uneven last batch), run as their own (compiled) program.

        ``iterator`` must be an iterator (``iter(dist_dataset)``), which each call advances; a
        dataset would start again at its first element on every call.
        """
        self._require_cross_replica("run_steps")
        steps = self._extended.steps_per_execution if steps is None else steps
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if not isinstance(iterator, Iterator):
            raise TypeError(
                f"run_steps needs an iterator, got {type(iterator).__name__}: pass "
                "iter(dataset) (e.g. it = iter(strategy.experimental_distribute_dataset(...))) "
                "and the same iterator to every call, which then continues where the last one "
                "stopped; a dataset would restart at its first element each call"
            )
        it = iterator
        elements = []
        for _ in range(steps):
            try:
                elements.append(next(it))
            except StopIteration:
                break
        result = None
        ext = self._extended
        for group in same_shape_runs(elements):
            if not ext._run_lock.acquire(blocking=False):
                raise RuntimeError("strategy.run_steps() is already running")
            try:
                result = ext._execute(fn, [((e,), {}) for e in group], scan=True)
            finally:
                ext._run_lock.release()
        return result

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduces ``value`` across replicas with XLA (the per-replica arrays are reduced on the
        devices, not gathered to the host); returns a replicated ``jax.Array``.

        ``axis=None`` reduces elementwise across replicas; with an ``axis``, along it too (MEAN
        counts every replica's elements; along axis 0 of a padded batch, its real rows only).
        A non-distributed value follows every strategy's rules
        (``strategies.strategy.non_distributed_reduce_rule``): with one replica in this process
        it is that replica's value, reduced across processes; otherwise, with an ``axis``, it is
        every replica's value (SUM: num_replicas times its sum along ``axis``), and without one
        the same on every replica: MEAN returns it, SUM over several replicas is an error.
        """
        op = parse_reduce_op(reduce_op)
        self._require_cross_replica("reduce")
        n = self.num_replicas_in_sync

        def leaf(x: Any) -> Any:
            if isinstance(x, (DistributedVariable, Mirrored)):
                # The same on every replica: tf sums (or averages) the copies.
                arr = np.asarray(
                    x.read_value() if isinstance(x, DistributedVariable) else x.values[0]
                )
                if axis is not None:
                    arr = arr.sum(axis=axis) if op == ReduceOp.SUM else arr.mean(axis=axis)
                return self._extended._replicate(
                    (arr * n if op == ReduceOp.SUM else arr).astype(arr.dtype)
                )
            if isinstance(x, DistributedValues):
                return reductions.reduce_global(
                    self._extended._global(x), op, axis, self._extended._valid_rows(x)
                )
            arr = host_array(x)
            rule = non_distributed_reduce_rule(op, axis, n, self._extended._num_local_replicas)
            if rule == "same":
                return self._extended._replicate(arr)
            # "per_replica": this process's one replica's value; "every_replica": each one's
            copies = 1 if rule == "per_replica" else self._extended._num_local_replicas
            return reductions.reduce_global(
                self._extended._global(PerReplica([arr] * copies)), op, axis
            )

        return _nest.map_structure(leaf, value)

    def gather(self, value: Any, axis: int) -> Any:
        """Gathers ``value`` across replicas along ``axis`` (concatenated in replica order) with
        XLA; returns a replicated ``jax.Array``. Every replica's part has the same shape (rows
        of padded batches included)."""
        self._require_cross_replica("gather")
        n = self.num_replicas_in_sync

        def leaf(x: Any) -> Any:
            if isinstance(x, DistributedValues) and not isinstance(x, DistributedVariable):
                return reductions.gather_global(
                    self._extended._global(x), axis, self._extended._valid_rows(x)
                )
            arr = np.asarray(x.read_value() if isinstance(x, DistributedVariable) else x)
            return self._extended._replicate(np.concatenate([arr] * n, axis=axis))

        return _nest.map_structure(leaf, value)

    def experimental_distribute_dataset(
        self, dataset: Iterable[Any], options: InputOptions | None = None
    ) -> TPUDistributedDataset:
        """Distributes an iterable of global batches: each batch is split across all replicas
        along axis 0, and an uneven batch is padded with zero rows to ``ceil(B / replicas)``
        rows per replica (see ``experimental_valid_rows``).

        ``options``: the batches are always split per worker and placed on the devices by
        ``run``; an InputOptions asking for anything else raises NotImplementedError."""
        _check_input_options(options, "experimental_distribute_dataset")
        if (
            options is not None
            and options.experimental_replication_mode != InputReplicationMode.PER_WORKER
        ):
            raise NotImplementedError(
                "experimental_distribute_dataset splits global batches per worker; "
                f"experimental_replication_mode={options.experimental_replication_mode.name} "
                "needs distribute_datasets_from_function"
            )
        return TPUDistributedDataset(self, dataset)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[..., Iterable[Any]], options: InputOptions | None = None
    ) -> DistributedDatasetsFromFunction:
        """Calls ``dataset_fn(InputContext)`` once per process (or per replica) for per-replica
        batches. A replica whose pipeline ended gets an empty batch, which ``run`` pads with
        zero rows (``experimental_valid_rows`` is 0 there)."""
        _check_input_options(options, "distribute_datasets_from_function")
        return DistributedDatasetsFromFunction(self, dataset_fn, options)


def _check_input_options(options: InputOptions | None, where: str) -> None:
    """Raises for InputOptions fields that TPUStrategy's input cannot honour."""
    if options is None:
        return
    unsupported = []
    if options.experimental_fetch_to_device is False:
        unsupported.append(
            "experimental_fetch_to_device=False (run always puts the batch on the devices)"
        )
    if options.experimental_place_dataset_on_device:
        unsupported.append(
            "experimental_place_dataset_on_device=True (the dataset is read on the host)"
        )
    if options.experimental_per_replica_buffer_size != 1:
        unsupported.append(
            f"experimental_per_replica_buffer_size="
            f"{options.experimental_per_replica_buffer_size} (no prefetching)"
        )
    if unsupported:
        raise NotImplementedError(
            f"{where}: TPUStrategy cannot honour InputOptions "
            f"{'; '.join(unsupported)}; leave these fields at their "
            "defaults"
        )


def _assign_devices(devices: list[Any], assignment: Any) -> list[Any]:
    if assignment is None:
        return devices
    cores = getattr(assignment, "num_cores_per_replica", 1)
    if cores != 1:
        raise NotImplementedError(
            f"experimental_device_assignment with num_cores_per_replica={cores}: a replica "
            "spanning several cores is model parallelism, which TPUStrategy does not support "
            "(every replica is one device holding a full copy of each variable); use a "
            "DeviceAssignment with num_cores_per_replica=1"
        )
    if hasattr(assignment, "num_replicas"):
        assignment = int(assignment.num_replicas)
    if isinstance(assignment, int) and not isinstance(assignment, bool):
        if not 1 <= assignment <= len(devices):
            raise ValueError(
                f"experimental_device_assignment={assignment}: the job has {len(devices)} devices"
            )
        return devices[:assignment]
    chosen = list(assignment)
    unknown = [d for d in chosen if d not in devices]
    if not chosen or unknown:
        raise ValueError(
            f"experimental_device_assignment must name devices of the job ({devices}); got {chosen}"
        )
    return chosen
