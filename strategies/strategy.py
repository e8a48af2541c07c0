"""Strategy, StrategyExtended and ReplicaContext: the tf.distribute vocabulary over pycollective.

A strategy owns a collective backend (:mod:`.backend`) and a CrossDeviceOps (the algorithm).
``run(fn)`` runs ``fn`` once per local replica, each on its own thread (replica 0 on the
caller's, the others on long-lived replica threads), in its own ReplicaContext. Replica-context
collectives meet in collective slots (:mod:`.collective_slots`): the last replica to arrive runs the
collective once for all (the native code releases the GIL) and every replica picks its own
result.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import _context, _nest, _tensors
from ._replica_threads import ReplicaThreads
from .backend import CollectiveBackend, LocalBackend
from .collective_slots import CollectiveSlots, ReplicaFailed
from .communication import CommunicationOptions
from .cross_device_ops import AlgorithmAllReduce, CrossDeviceOps, _plain, call_settings
from .input_lib import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
    InputOptions,
    distribute_values,
)
from .reduce_util import ReduceOp, parse_reduce_op
from .values import (
    DistributedValues,
    Mirrored,
    PerReplica,
    check_replica_counts,
    local_results,
    regroup,
    select_replica,
)
from .variables import (
    ComponentVariable,
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    VariableAggregation,
    VariableSynchronization,
)


class ReplicaContext:
    """A class with a collection of APIs that can be called in a replica context.

    ``get_replica_context()`` returns it inside ``strategy.run``. Its collectives must be called
    by every replica, in the same order.
    """

    def __init__(self, strategy: Strategy, replica_id_in_sync_group: int) -> None:
        self._strategy = strategy
        self._replica_id = int(replica_id_in_sync_group)
        self._local_id = self._replica_id - strategy.extended._first_replica_id
        self._collective_slots: CollectiveSlots | None = None

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica {self._replica_id} of {self._strategy.num_replicas_in_sync})"
        )

    @property
    def strategy(self) -> Strategy:
        """The current Strategy object."""
        return self._strategy

    @property
    def replica_id_in_sync_group(self) -> int:
        """Returns the id of the replica (global, in ``[0, num_replicas_in_sync)``)."""
        return self._replica_id

    @property
    def num_replicas_in_sync(self) -> int:
        """Returns number of replicas that are kept in sync."""
        return self._strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        """Returns the devices this replica is to be executed on, as a tuple of strings."""
        return (self._strategy.extended.worker_devices[self._local_id],)

    def _exchange(
        self,
        what: str,
        value: Any,
        fn: Callable[[list[Any]], Sequence[Any]],
        options: CommunicationOptions | None = None,
    ) -> Any:
        """``fn`` over every replica's ``value``, run once. ``options`` (one call's, merged
        with the strategy's): their timeout bounds the wait for the other replicas and the
        backend's collectives in ``fn``, which run their implementation's algorithm."""
        timeout, algorithm = call_settings(options)

        def run(values: list[Any]) -> Sequence[Any]:
            if timeout is None and algorithm is None:
                return fn(values)
            with self._strategy.extended.backend.call_options(timeout, algorithm):
                return fn(values)

        if self._collective_slots is None:  # the default context: one replica, no threads
            return run([value])[0]
        return self._collective_slots.exchange(self._local_id, what, value, run, timeout)

    def all_reduce(
        self, reduce_op: Any, value: Any, options: CommunicationOptions | None = None
    ) -> Any:
        """All-reduces ``value`` (a tensor, or a nest of tensors) across all replicas.

        A nest is fused: tensors are concatenated into flat buffers (per dtype, in packs of
        ``options.bytes_per_pack`` bytes, else the cross-device ops' ``num_packs``), one
        collective per pack, and split back. Every replica gets the same result.
        """
        op = parse_reduce_op(reduce_op)
        flat = [_plain(x) for x in _nest.flatten(value)]
        if not flat:
            return value
        ext = self._strategy.extended
        opts = ext._options.merge(options)

        def reduce_all(per_replica: list[list[Any]]) -> list[list[Any]]:
            return ext.backend.batch_allreduce(
                per_replica,
                op,
                bytes_per_pack=opts.bytes_per_pack,
                num_packs=ext._cross_device_ops.num_packs,
            )

        result = self._exchange(
            f"all_reduce({op.name}, {len(flat)} tensors)", flat, reduce_all, opts
        )
        return _nest.pack_sequence_as(value, result)

    def all_gather(self, value: Any, axis: int, options: CommunicationOptions | None = None) -> Any:
        """All-gathers ``value`` (a tensor or a nest) across replicas along ``axis``: every
        replica gets the concatenation in replica order. Sizes along ``axis`` may differ
        between replicas."""
        flat = [_plain(x) for x in _nest.flatten(value)]
        if not flat:
            return value
        backend = self._strategy.extended.backend
        opts = self._strategy.extended._options.merge(options)

        def gather_all(per_replica: list[list[Any]]) -> list[list[Any]]:
            outs: list[list[Any]] = [[None] * len(flat) for _ in per_replica]
            for j in range(len(flat)):
                res = backend.gather([vals[j] for vals in per_replica], axis)
                for r, x in enumerate(res):
                    outs[r][j] = x
            return outs

        result = self._exchange(
            f"all_gather(axis={axis}, {len(flat)} tensors)", flat, gather_all, opts
        )
        return _nest.pack_sequence_as(value, result)

    def merge_call(
        self,
        merge_fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Merge args across replicas and run ``merge_fn`` in a cross-replica context.

        Every replica must call it; they meet, ``merge_fn(strategy, *args, **kwargs)`` runs once
        with each argument combined into a PerReplica value (an object every replica passed
        itself, like a variable, stays as it is), and every replica gets the result (its own
        component when the result is a distributed value).
        """
        strategy = self._strategy
        kwargs = dict(kwargs or {})

        def merge(payloads: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
            m_args = regroup([p[0] for p in payloads])
            m_kwargs = regroup([p[1] for p in payloads])
            frame = _context.Frame(strategy, None)
            _context.push(frame)
            try:
                result = merge_fn(strategy, *m_args, **m_kwargs)
            finally:
                _context.pop(frame)
            return [select_replica(i, result) for i in range(len(payloads))]

        name = getattr(merge_fn, "__name__", type(merge_fn).__name__)
        return self._exchange(f"merge_call({name})", (tuple(args), kwargs), merge)


class _Scope:
    def __init__(self, strategy: Strategy) -> None:
        self._strategy = strategy
        self._frames: list[_context.Frame] = []

    def __enter__(self) -> Strategy:
        current = _context.current_frame()
        default = _context.default_strategy()
        if (
            current is not None
            and current.strategy is not self._strategy
            and current.strategy is not default
        ):
            raise RuntimeError(
                f"Mixing different Strategy objects: {self._strategy!r} is not "
                f"{current.strategy!r}, whose scope is active"
            )
        if current is not None and current.strategy is self._strategy:
            frame = _context.Frame(self._strategy, current.replica_context)
        else:
            frame = _context.Frame(self._strategy, None)
        _context.push(frame)
        self._frames.append(frame)
        return self._strategy

    def __exit__(self, *exc: object) -> None:
        _context.pop(self._frames.pop())


class Strategy:
    """A state & compute distribution policy on a list of devices.

    Concrete strategies: MirroredStrategy (replicas are threads of this process) and
    MultiWorkerMirroredStrategy (replicas in several processes).
    """

    def __init__(self, extended: StrategyExtended) -> None:
        self._extended = extended

    def __repr__(self) -> str:
        return f"<{type(self).__name__} with {self.num_replicas_in_sync} replicas>"

    @property
    def extended(self) -> StrategyExtended:
        """StrategyExtended with additional methods."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Returns number of replicas over which gradients are aggregated."""
        return self._extended._num_replicas_in_sync

    @property
    def cluster_resolver(self) -> Any:
        """Returns the cluster resolver associated with this strategy (None for one process)."""
        return None

    def scope(self) -> _Scope:
        """Context manager to make the strategy current and distribute variables: variables
        created in it are MirroredVariables (or SyncOnReadVariables)."""
        return _Scope(self)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """Invokes ``fn`` on each replica, with the given arguments.

        Each local replica runs ``fn`` concurrently on its own thread, in its own
        ReplicaContext. PerReplica arguments give each replica its component; other arguments
        (variables included) are passed as they are. Returns the results as PerReplica values
        (a value that is the same object on every replica, e.g. a variable or anything with
        one replica, is returned as it is). If a replica raises, the replicas waiting for it
        are released and its exception is re-raised here.
        """
        return self._extended._call_for_each_replica(fn, args, kwargs or {})

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduce ``value`` across replicas and return the result (on every local replica;
        this returns one copy).

        ``axis=None`` reduces the per-replica values elementwise; with an ``axis``, each
        replica first reduces along it (a MEAN counts the elements of every replica, so uneven
        batches average correctly). With one local replica a plain value is that replica's
        value (reduced across workers); otherwise a non-distributed value is every local
        replica's value: with an ``axis``, SUM gives num_replicas times its sum along it (tf
        runs the reduction on each replica), and without one MEAN returns it and SUM over more
        than one replica is an error (tf's rules).
        """
        op = parse_reduce_op(reduce_op)
        self._require_cross_replica("reduce")
        ext = self._extended
        flat = _nest.flatten(value)
        if not flat:
            return value
        n_sync = self.num_replicas_in_sync
        pairs: list[tuple[Any, Any]] = []
        # Per leaf: how many reduced values it takes, and how it turns them into its result.
        finish: list[tuple[int, Callable[[list[Any]], Any]]] = []
        for leaf in flat:
            if not isinstance(leaf, DistributedValues):
                rule = non_distributed_reduce_rule(op, axis, n_sync, ext._num_local_replicas)
                if rule == "per_replica":
                    leaf = PerReplica([leaf])
                elif rule == "every_replica":
                    leaf = PerReplica([leaf] * ext._num_local_replicas)
                else:  # "same": its MEAN is itself
                    template = _plain(leaf)
                    pairs.append((template, None))
                    finish.append((1, lambda res, t=template: _like_out(res[0], t)))
                    continue
            template = _plain(leaf.values[0])
            if axis is None:
                pairs.append((leaf, None))
                finish.append((1, lambda res, t=template: _like_out(res[0], t)))
                continue
            comps = [_tensors.to_numpy(_plain(c)) for c in leaf.values]
            dtype = comps[0].dtype
            pairs.append(
                (PerReplica([np.asarray(c.sum(axis=axis), dtype=dtype) for c in comps]), None)
            )
            if op == ReduceOp.SUM:
                finish.append((1, lambda res, t=template: _like_out(res[0], t)))
            else:  # MEAN over every replica's elements: sum the counts too
                pairs.append((PerReplica([np.asarray(float(c.shape[axis])) for c in comps]), None))
                finish.append(
                    (
                        2,
                        lambda res, t=template, d=dtype: _like_out(
                            (_tensors.to_numpy(res[0]) / _tensors.to_numpy(res[1])).astype(d), t
                        ),
                    )
                )
        sum_op = ReduceOp.SUM if axis is not None else op
        reduced = (
            ext._cross_device_ops._batch_reduce(ext.backend, sum_op, pairs, ext._options)
            if pairs
            else []
        )
        out = []
        k = 0
        for takes, leaf_finish in finish:
            out.append(leaf_finish([_primary(m) for m in reduced[k : k + takes]]))
            k += takes
        return _nest.pack_sequence_as(value, out)

    def gather(self, value: Any, axis: int) -> Any:
        """Gather ``value`` across replicas along ``axis`` (concatenated in replica order; sizes
        along ``axis`` may differ). A non-distributed value counts as the same on every
        replica."""
        self._require_cross_replica("gather")
        ext = self._extended
        n_local = ext._num_local_replicas

        def gather_leaf(leaf: Any) -> Any:
            if isinstance(leaf, DistributedValues):
                comps = [_plain(c) for c in leaf.values]
            else:
                comps = [_plain(leaf)] * n_local
            return ext.backend.gather(comps, axis)[0]

        return _nest.map_structure(gather_leaf, value)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """Returns the list of all local per-replica values contained in ``value`` (a plain
        value gives ``(value,)``)."""
        return local_results(value, self._extended._num_local_replicas)

    def unwrap(self, value: Any) -> tuple[Any, ...]:
        """Deprecated alias of experimental_local_results."""
        return self.experimental_local_results(value)

    def experimental_distribute_dataset(
        self, dataset: Iterable[Any], options: InputOptions | None = None
    ) -> DistributedDataset:
        """Distributes an iterable of global batches: each batch (an array, or a
        tuple/dict of arrays) is split across all replicas in sync along axis 0."""
        return DistributedDataset(self, dataset)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[..., Iterable[Any]], options: InputOptions | None = None
    ) -> DistributedDatasetsFromFunction:
        """Distributes datasets made by ``dataset_fn(InputContext)``: one per worker, yielding
        per-replica batches (see InputContext.get_per_replica_batch_size)."""
        return DistributedDatasetsFromFunction(self, dataset_fn, options)

    def experimental_distribute_datasets_from_function(
        self, dataset_fn: Callable[..., Any], options: InputOptions | None = None
    ) -> DistributedDatasetsFromFunction:
        """Deprecated: renamed distribute_datasets_from_function."""
        return self.distribute_datasets_from_function(dataset_fn, options)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[..., Any]
    ) -> PerReplica:
        """Generates a PerReplica value from ``value_fn(ValueContext)``, called once per local
        replica."""
        return distribute_values(self, value_fn)

    def group(self, value: Any, name: str | None = None) -> tuple[Any, ...]:
        """The local results of ``value`` (tf groups them into one op; eager code needs
        nothing more)."""
        return self.experimental_local_results(value)

    def _require_cross_replica(self, what: str) -> None:
        frame = _context.current_frame()
        if (
            frame is not None
            and frame.replica_context is not None
            and frame.replica_context._collective_slots is not None
        ):
            raise RuntimeError(
                f"strategy.{what}() must be called in a cross-replica context "
                "(outside strategy.run); inside run use get_replica_context()."
                "all_reduce/all_gather or merge_call"
            )


class StrategyExtended:
    """Additional APIs for algorithms that need to be distribution-aware.

    ``_shard_optimizer_state``: optimizers keep only this worker's shard of their slots
    (MultiWorkerMirroredStrategy(shard_optimizer_state=True) with several workers).

    Args:
        container_strategy: the Strategy this belongs to.
        backend: the collective backend (LocalBackend, MultiWorkerBackend).
        cross_device_ops: the CrossDeviceOps (algorithm and packing).
        devices: this worker's replica devices, one per local replica.
        options: default CommunicationOptions (timeout, bytes_per_pack).
    """

    def __init__(
        self,
        container_strategy: Strategy,
        backend: CollectiveBackend,
        cross_device_ops: CrossDeviceOps,
        devices: Sequence[str],
        options: CommunicationOptions | None = None,
    ) -> None:
        if len(devices) != backend.num_local_replicas:
            raise ValueError(f"{len(devices)} devices for {backend.num_local_replicas} replicas")
        self._init_common(container_strategy, devices, options)
        self._shard_optimizer_state = False
        # False on a replacement joining a running elastic job (MultiWorkerMirroredStrategy).
        self._broadcast_initial_values = True
        self._backend = backend
        self._cross_device_ops = cross_device_ops
        self._timeout = self._options.timeout_seconds or backend.timeout

    def _init_common(
        self,
        container_strategy: Strategy,
        devices: Sequence[str],
        options: CommunicationOptions | None,
    ) -> None:
        """The state every StrategyExtended has, whatever runs its replicas (a strategy whose
        replicas do not run on a collective backend, like TPUStrategy, calls only this)."""
        self._container_strategy_ref = container_strategy
        self._devices = tuple(devices)
        self._options = options or CommunicationOptions()
        self._created: weakref.WeakSet[DistributedVariable] = weakref.WeakSet()
        self._run_lock = threading.Lock()
        self._default_replica_context: ReplicaContext | None = None
        self._replica_threads: ReplicaThreads | None = None  # started by the first run()

    def _container_strategy(self) -> Strategy:
        return self._container_strategy_ref

    # Topology -----------------------------------------------------------------------------------

    @property
    def backend(self) -> CollectiveBackend:
        """The collective backend every cross-replica operation of this strategy runs on
        (``call_counts`` counts its collectives)."""
        return self._backend

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        return self._cross_device_ops

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """Returns the tuple of all devices used to for compute replica execution."""
        return self._devices

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """Returns the tuple of all devices used to place variables."""
        return self._devices

    @property
    def _num_local_replicas(self) -> int:
        return self._backend.num_local_replicas

    @property
    def _num_workers(self) -> int:
        return self._backend.num_workers

    @property
    def _worker_index(self) -> int:
        return self._backend.worker_index

    @property
    def _first_replica_id(self) -> int:
        return self._backend.first_replica_id

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._backend.num_replicas_in_sync

    @property
    def experimental_require_static_shapes(self) -> bool:
        return False

    @property
    def experimental_between_graph(self) -> bool:
        return self._num_workers > 1

    @property
    def experimental_should_init(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        """Whether this worker writes checkpoints (the chief: worker 0)."""
        return self._worker_index == 0

    @property
    def should_save_summary(self) -> bool:
        return self._worker_index == 0

    # Running replicas ---------------------------------------------------------------------------

    def call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Run ``fn`` once per replica (what strategy.run does)."""
        return self._call_for_each_replica(fn, args, kwargs or {})

    def _call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        strategy = self._container_strategy()
        frame = _context.current_frame()
        if (
            frame is not None
            and frame.replica_context is not None
            and frame.replica_context._collective_slots is not None
        ):
            raise RuntimeError(
                "strategy.run() was called inside a replica function; nested "
                "run() is not supported: call the function directly"
            )
        if (
            frame is not None
            and frame.strategy is not strategy
            and frame.strategy is not _context.default_strategy()
        ):
            raise RuntimeError(
                f"run() of {strategy!r} was called inside the scope of {frame.strategy!r}"
            )
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
        if not self._run_lock.acquire(blocking=False):
            raise RuntimeError(
                "strategy.run() is already running (in another thread, or "
                "this call comes from inside merge_fn); a strategy runs one step "
                "at a time"
            )
        try:
            return self._run_replicas(strategy, fn, tuple(args), kwargs)
        finally:
            self._run_lock.release()

    def _run_replicas(
        self,
        strategy: Strategy,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        n = self._num_local_replicas
        first = self._first_replica_id
        n_sync = self._num_replicas_in_sync
        names = [f"replica {first + r}" for r in range(n)]
        slots = CollectiveSlots(n, self._timeout, names)
        contexts = []
        for r in range(n):
            ctx = ReplicaContext(strategy, first + r)
            ctx._collective_slots = slots
            contexts.append(ctx)
        check_replica_counts(n, (args, kwargs))
        per_args = [select_replica(r, args) for r in range(n)]
        # fn(**kwargs) unpacks into a fresh dict: empty kwargs need no copy per replica.
        per_kwargs = [select_replica(r, kwargs) if kwargs else kwargs for r in range(n)]
        results: list[Any] = [None] * n
        errors: list[BaseException | None] = [None] * n

        def replica_main(r: int) -> None:
            frame = _context.Frame(strategy, contexts[r])
            _context.push(frame)
            try:
                results[r] = fn(*per_args[r], **per_kwargs[r])
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller of run()
                errors[r] = exc
                slots.abort(r, exc)
            else:
                slots.replica_done(r)
            finally:
                try:
                    _context.pop(frame)
                except RuntimeError as exc:  # fn left a scope open on this (long-lived) thread
                    _context.unwind(frame)
                    if errors[r] is None:
                        errors[r] = exc

        if n == 1:
            replica_main(0)
        else:
            if self._replica_threads is None:
                self._replica_threads = ReplicaThreads(
                    [f"pycollective-replica-{first + r}" for r in range(n)]
                )
            try:
                self._replica_threads.run([functools.partial(replica_main, r) for r in range(n)])
            except BaseException as exc:
                slots.cancel(f"run() was interrupted in the calling thread: {exc!r}")
                raise
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            r, exc = next(
                ((r, e) for r, e in failed if not isinstance(e, ReplicaFailed)), failed[0]
            )
            if hasattr(exc, "add_note") and n_sync > 1:
                exc.add_note(f"(raised in replica {first + r} of {n_sync}, in strategy.run)")
            raise exc
        return regroup(results)

    # Cross-replica operations -------------------------------------------------------------------

    def _require_cross_replica(self, what: str) -> None:
        self._container_strategy()._require_cross_replica(f"extended.{what}")

    def reduce_to(
        self,
        reduce_op: Any,
        value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Combine (via e.g. sum or mean) values across replicas; returns a Mirrored value
        (a plain tensor when ``destinations`` is one device string)."""
        self._require_cross_replica("reduce_to")
        return self._cross_device_ops._batch_reduce(
            self._backend, reduce_op, [(value, destinations)], self._options.merge(options)
        )[0]

    def batch_reduce_to(
        self,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Combine multiple ``reduce_to`` calls into one: the values are concatenated into one
        flat buffer per replica (per dtype), reduced with ONE collective (or one per pack, see
        CommunicationOptions.bytes_per_pack / num_packs) and split back."""
        self._require_cross_replica("batch_reduce_to")
        return self._cross_device_ops._batch_reduce(
            self._backend, reduce_op, value_destination_pairs, self._options.merge(options)
        )

    def update(
        self,
        var: DistributedVariable,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
        """Run ``fn(component, *args, **kwargs)`` once per local replica to update ``var``: the
        component is replica i's copy (a ComponentVariable; its assign touches that copy only)
        and PerReplica/Mirrored arguments give their component i."""
        self._require_cross_replica("update")
        if not isinstance(var, DistributedVariable):
            raise TypeError(f"update expects a distributed variable, got {type(var).__name__}")
        kwargs = kwargs or {}
        results = [
            fn(var.values[i], *select_replica(i, tuple(args)), **select_replica(i, kwargs))
            for i in range(len(var.values))
        ]
        return regroup(results, Mirrored if group else PerReplica)

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Mirror a tensor on one device to all worker devices (from global replica 0 across
        workers)."""
        self._require_cross_replica("broadcast_to")
        return self._cross_device_ops._broadcast(self._backend, tensor, destinations)

    def value_container(self, value: Any) -> Any:
        """Returns the container that this per-replica ``value`` belongs to."""
        if isinstance(value, ComponentVariable):
            return value._distributed_container
        return value

    def variable_created_in_scope(self, v: Any) -> bool:
        """Tests whether ``v`` was created while this strategy scope was active."""
        return isinstance(v, DistributedVariable) and v in self._created

    def colocate_vars_with(self, colocate_with_variable: Any) -> contextlib.AbstractContextManager:
        """Scope that controls which devices variables will be created on (a no-op: every
        variable has a copy on every replica)."""
        return contextlib.nullcontext()

    def read_var(self, v: DistributedVariable) -> np.ndarray:
        """Reads the value of a variable (aggregated for sync-on-read variables)."""
        return v.read_value()

    def _create_variable(
        self,
        initial: np.ndarray,
        name: str,
        trainable: bool,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
        broadcast_initial: bool = True,
    ) -> DistributedVariable:
        n = self._num_local_replicas
        arrays = [np.array(initial, copy=True, order="C") for _ in range(n)]
        if self._num_workers > 1 and broadcast_initial and self._broadcast_initial_values:
            # Every worker starts from the chief's initial value (a collective: every worker
            # creates its variables in the same order).
            arrays = [np.array(a, copy=True) for a in self._backend.broadcast(arrays, root=0)]
        cls = (
            SyncOnReadVariable
            if synchronization == VariableSynchronization.ON_READ
            else MirroredVariable
        )
        var = cls(self._container_strategy(), arrays, name, trainable, aggregation, synchronization)
        self._created.add(var)
        return var


def non_distributed_reduce_rule(
    op: ReduceOp, axis: int | None, n_sync: int, num_local_replicas: int
) -> str:
    """How ``Strategy.reduce`` treats a value that is not distributed (tf's rules, shared by
    every strategy): ``"per_replica"`` -- with one local replica the value is that replica's
    value, reduced across workers like a PerReplica; ``"every_replica"`` -- with an ``axis``
    it is every local replica's value, as tf's ``reduce`` runs the reduction along ``axis`` on
    each replica (SUM: the replicas' sums added, num_replicas times the sum of one; MEAN: the
    mean over every replica's elements); ``"same"`` -- (``axis=None``) the value is the same
    on every replica, so its MEAN is itself. SUM of such a value over several replicas is
    ambiguous in tf, and raises ValueError."""
    if num_local_replicas == 1:
        return "per_replica"
    if axis is not None:
        return "every_replica"
    if op == ReduceOp.SUM and n_sync > 1:
        raise ValueError(
            f"A non-DistributedValues value cannot be reduced with "
            f"ReduceOp.SUM over {n_sync} replicas; pass a PerReplica "
            "value (e.g. the result of strategy.run) or use "
            "ReduceOp.MEAN"
        )
    return "same"


def _primary(value: Any) -> Any:
    return value.values[0] if isinstance(value, DistributedValues) else value


def _like_out(result: Any, template: Any) -> Any:
    return _tensors.like(_tensors.to_numpy(result), template)


class _DefaultDistributionStrategy(Strategy):
    """The strategy in effect when no other is: one replica, the calling thread."""

    def __init__(self) -> None:
        extended = StrategyExtended(
            self,
            LocalBackend(1),
            AlgorithmAllReduce("auto"),
            ("/job:localhost/replica:0/task:0/device:CPU:0",),
        )
        super().__init__(extended)
        extended._default_replica_context = ReplicaContext(self, 0)

    def __repr__(self) -> str:
        return "<default Strategy (one replica)>"


_default_lock = threading.Lock()
_default: list[_DefaultDistributionStrategy] = []


def _get_default_strategy() -> _DefaultDistributionStrategy:
    if not _default:
        with _default_lock:
            if not _default:
                _default.append(_DefaultDistributionStrategy())
    return _default[0]


_context.register_default_strategy(_get_default_strategy)
