"""The ``worker`` task's gRPC service: :class:`WorkerService` runs the functions the coordinator
schedules. A function arrives pickled inside a signed payload; the worker checks the HMAC before
unpickling, rebuilds variable handles, the optimizer and its per-worker iterators, runs the
function (pulling variables from, and pushing gradients to, the ps tasks) and sends the result
back as tensors."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import numpy as np

from .. import _context
from ..backend import LocalBackend
from ..cross_device_ops import AlgorithmAllReduce
from ..input_lib import InputContext
from ..strategy import Strategy, StrategyExtended
from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from ._service_util import abort, rebuild_optimizer, refuse_payload
from .client import PSClient, PullEntry, set_abandon_event
from .errors import OutOfRangeError, UnavailableError, worker_task
from .variables import (
    IterationsVariable,
    ParameterServerVariable,
    RemoteVariable,
    Shard,
    ShardedVariable,
    assign_calls,
    join_rows,
    push_calls,
)

_log = logging.getLogger("pycollective.strategies.parameter_server")


class _MissingIterator(Exception):
    pass


class _WorkerExtended(StrategyExtended):
    def __init__(self, container: Strategy, task_index: int, num_replicas_in_sync: int) -> None:
        super().__init__(
            container,
            LocalBackend(1),
            AlgorithmAllReduce("auto"),
            (f"{worker_task(task_index)}/device:CPU:0",),
        )
        self._n_sync = num_replicas_in_sync

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._n_sync

    def _create_variable(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "variables of ParameterServerStrategy are created on the coordinator, "
            "in strategy.scope(), not inside scheduled functions"
        )


class WorkerStrategy(Strategy):
    """What ``strategy`` is inside a function running on a worker: one local replica; its
    variables are handles to the parameter servers."""

    def __init__(self, task_index: int, num_replicas_in_sync: int) -> None:
        super().__init__(_WorkerExtended(self, task_index, num_replicas_in_sync))
        self._task_index = task_index

    def __repr__(self) -> str:
        return f"<ParameterServerStrategy on {worker_task(self._task_index)}>"


class _RemoteOptimizerMixin:
    """Put in front of the coordinator's optimizer class on a worker: apply_gradients pushes
    the gradients to the parameter servers, which run the class's own update arithmetic."""

    _ps_store: ClosureStore
    _ps_optimizer_id: str

    def apply_gradients(
        self, grads_and_vars: Any, name: str | None = None, skip_gradients_aggregation: bool = False
    ) -> Any:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if pairs:
            self._ps_store.push(self._ps_optimizer_id, pairs)
        return self.iterations

    @property
    def iterations(self) -> IterationsVariable:
        store = self._ps_store
        return IterationsVariable(
            None,
            store.client,
            self._ps_optimizer_id,
            f"{getattr(self, 'name', 'optimizer')}/iterations",
            store.meta["ps"],
        )

    def build(self, var_list: Any) -> None:
        """Slots live on the parameter servers: nothing to build here."""


class KeptValues:
    """Variable values a worker keeps between scheduled functions: what its last push to each
    ps task returned (the values right after its own update), with the task's write clock.

    A function may use them instead of pulling when the clock is at least the one the
    coordinator sent with the function (the newest write it knows of: its own calls and every
    finished function's). So a function never reads values older than a write that finished
    before it was scheduled, as if it had pulled; in synchronous training every step's values
    come back with its push, and a step costs one exchange per ps task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_task: dict[int, tuple[int, dict[str, np.ndarray]]] = {}

    def keep(self, task: int, clock: int, values: dict[str, np.ndarray]) -> None:
        for v in values.values():
            v.flags.writeable = False  # shared by later functions
        with self._lock:
            current = self._by_task.get(task)
            if current is None or current[0] <= clock:
                self._by_task[task] = (clock, values)

    def get(self, task: int, keys: list[str], newer_than: int) -> dict[str, np.ndarray] | None:
        """The values of ``keys`` on ``task`` if kept from clock ``newer_than`` or later."""
        with self._lock:
            current = self._by_task.get(task)
        if current is None or current[0] < newer_than:
            return None
        values = current[1]
        if any(k not in values for k in keys):
            return None
        return {k: values[k] for k in keys}

    def drop(self, tasks: Any) -> None:
        with self._lock:
            for task in tasks:
                self._by_task.pop(task, None)


class ClosureStore:
    """Variable reads and writes of one scheduled function on a worker: each variable is pulled
    at most once (all the function's variables in one call per ps task, on first use, unless the
    worker kept current values: KeptValues), and read again with the push that updates it."""

    def __init__(self, runtime: WorkerService, resolved: Mapping[int, Any]) -> None:
        self.runtime = runtime
        self.resolved = resolved
        self.meta: dict[str, Any] = {}
        self.handles: list[RemoteVariable] = []
        self.cache: dict[str, np.ndarray] = {}
        # key -> (task, entry) of every variable read: what a push reads again
        self.read_from: dict[str, tuple[int, PullEntry]] = {}
        #: ps task -> the write clock the values read must have reached (from the coordinator)
        self.required: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> PSClient:
        return self.runtime.client(self.meta.get("rpc_timeout", 30.0))

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "variable":
            handle = self.runtime.make_handle(self, pid[1])
            self.handles.append(handle)
            return handle
        if kind == "strategy":
            return self.runtime.strategy(int(pid[1]))
        if kind == "optimizer":
            return self.runtime.make_optimizer(self, pid[1], pid[2], pid[3])
        if kind == "iterator":
            return self.runtime.iterator(int(pid[1]))
        if kind == "remote_value":
            return self.resolved[int(pid[1])]
        raise ValueError(f"unknown reference {kind!r} in a scheduled function")

    # Reading ------------------------------------------------------------------------------------

    def read(self, var: RemoteVariable) -> np.ndarray:
        with self._lock:
            missing = [s for s in var._shards if s.key not in self.cache]
            if missing:
                # Prefetch every variable this function refers to, one call per ps task.
                wanted: dict[str, PullEntry] = {}
                where: dict[str, tuple[int, str]] = {}
                for h in [var] + self.handles:
                    for s in h._shards:
                        if s.key not in self.cache and s.key not in wanted:
                            wanted[s.key] = PullEntry(s.key, s.shape, h.dtype)
                            where[s.key] = (s.task, s.address)
                by_task: dict[tuple[int, str], list[PullEntry]] = {}
                for key, entry in wanted.items():
                    by_task.setdefault(where[key], []).append(entry)
                    self.read_from[key] = (where[key][0], entry)
                kept = self.runtime.kept
                for (task, address), entries in list(by_task.items()):
                    values = kept.get(task, [e.key for e in entries], self.required.get(task, 0))
                    if values is not None:
                        self.cache.update(values)
                        del by_task[(task, address)]
                if by_task:
                    self.cache.update(
                        self.client.pull(
                            [(t, a, entries) for (t, a), entries in by_task.items()],
                            timeout=self.meta.get("rpc_timeout"),
                        )
                    )
            parts = [self.cache[s.key] for s in var._shards]
        return parts[0] if len(parts) == 1 else join_rows(parts)

    def invalidate(self, keys: Any) -> None:
        with self._lock:
            for k in keys:
                self.cache.pop(k, None)

    # Writing ------------------------------------------------------------------------------------

    def write(
        self, var: RemoteVariable, kind: str, value: np.ndarray, create: bool = False
    ) -> None:
        self.runtime.kept.drop({s.task for s in var._shards})
        self.client.call_many(
            assign_calls(var, kind, value, create, timeout=self.meta.get("rpc_timeout"))
        )
        self.invalidate([s.key for s in var._shards])

    def push(self, optimizer_id: str, pairs: list[tuple[Any, Any]]) -> int:
        """Pushes the gradients; each ps task returns, in the same exchange, the new values of
        the variables this function read from it (kept for the next function)."""
        synchronous = bool(self.meta.get("synchronous"))
        timeout = self.meta.get("sync_timeout") if synchronous else self.meta.get("rpc_timeout")
        calls = push_calls(optimizer_id, pairs, self.runtime.task_index, synchronous, timeout)
        reads: dict[int, list[PullEntry]] = {}
        for task, entry in self.read_from.values():
            reads.setdefault(task, []).append(PullEntry(entry.key, entry.shape, entry.dtype))
        responses, values, clocks = self.client.push_and_read(calls, reads)
        self.invalidate([k for c in calls for k in c.request.keys])
        with self._lock:
            self.cache.update(values)
        for task, clock in clocks.items():
            self.runtime.kept.keep(
                task, clock, {e.key: values[e.key] for e in reads[task] if e.key in values}
            )
        return max((r.iterations for r in responses), default=0)


class WorkerService(pb_grpc.WorkerServicer):
    """The runtime of one worker task: its datasets, iterators and ps channels."""

    def __init__(self, key: bytes, token: str, task_index: int, incarnation: str) -> None:
        self._key = key
        self._token = token
        self.task_index = task_index
        self._task = worker_task(task_index)
        self._incarnation = incarnation
        self._lock = threading.Lock()
        self._clients: dict[float, PSClient] = {}
        self._datasets: dict[int, Any] = {}
        self._iterators: dict[int, Iterator[Any]] = {}
        self._strategies: dict[int, WorkerStrategy] = {}
        self._optimizer_classes: dict[type, type] = {}
        self.kept = KeptValues()

    def writes_seen(self) -> dict[int, int]:
        """ps task -> the newest write clock any of this worker's calls saw."""
        with self._lock:
            clients = list(self._clients.values())
        seen: dict[int, int] = {}
        for c in clients:
            for task, clock in c.writes_seen().items():
                seen[task] = max(seen.get(task, 0), clock)
        return seen

    # Pieces of closures --------------------------------------------------------------------------

    def client(self, rpc_timeout: float) -> PSClient:
        with self._lock:
            c = self._clients.get(rpc_timeout)
            if c is None:
                c = self._clients[rpc_timeout] = PSClient(self._token, rpc_timeout)
            return c

    def strategy(self, num_replicas_in_sync: int) -> WorkerStrategy:
        with self._lock:
            s = self._strategies.get(num_replicas_in_sync)
            if s is None:
                s = self._strategies[num_replicas_in_sync] = WorkerStrategy(
                    self.task_index, num_replicas_in_sync
                )
            return s

    def make_handle(self, store: ClosureStore, spec: tuple) -> RemoteVariable:
        cls_name, name, shape, dtype, shards, trainable = spec
        shard_objs = [
            Shard(int(t), str(a), str(k), int(b), int(e), tuple(sh)) for t, a, k, b, e, sh in shards
        ]
        cls = ShardedVariable if cls_name == "ShardedVariable" else ParameterServerVariable
        return cls(None, store, name, tuple(shape), dtype, shard_objs, trainable)

    def make_optimizer(
        self, store: ClosureStore, optimizer_id: str, cls: type, state: dict[str, Any]
    ) -> Any:
        with self._lock:
            remote_cls = self._optimizer_classes.get(cls)
            if remote_cls is None:
                remote_cls = self._optimizer_classes[cls] = type(
                    cls.__name__,
                    (_RemoteOptimizerMixin, cls),
                    {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
                )
        opt = rebuild_optimizer(remote_cls, state)
        opt._ps_store = store
        opt._ps_optimizer_id = optimizer_id
        return opt

    def _dataset_reference(self, pid: Any) -> Any:
        if pid[0] == "strategy":
            return self.strategy(int(pid[1]))
        raise ValueError(f"a dataset function cannot refer to a {pid[0]} of the coordinator")

    def iterator(self, iterator_id: int) -> Iterator[Any]:
        with self._lock:
            it = self._iterators.get(iterator_id)
        if it is None:
            raise _MissingIterator(f"{self._task} has no iterator #{iterator_id}")
        return it

    # RPCs -------------------------------------------------------------------------------------

    def Ping(self, request: pb.PingRequest, context: grpc.ServicerContext) -> pb.PingResponse:
        return pb.PingResponse(incarnation=self._incarnation, job="worker", task=self.task_index)

    def CreateIterator(
        self, request: pb.CreateIteratorRequest, context: grpc.ServicerContext
    ) -> pb.CreateIteratorResponse:
        if not wire.verify(self._key, request.dataset, "dataset"):
            refuse_payload(context, "dataset function", self._task)
        with self._lock:
            dataset = self._datasets.get(request.dataset_id)
        if dataset is None:
            try:
                dataset_fn, num_workers, n_sync = wire.loads(
                    request.dataset, self._dataset_reference
                )
                dataset = call_dataset_fn(
                    dataset_fn, InputContext(num_workers, self.task_index, n_sync)
                )
                iter(dataset)  # fail here, not in the first closure, when it is not iterable
            except Exception as exc:  # noqa: BLE001 - reported to the coordinator
                abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self._task} could not build its dataset: "
                    f"{''.join(traceback.format_exception_only(type(exc), exc)).strip()}",
                )
            with self._lock:
                dataset = self._datasets.setdefault(request.dataset_id, dataset)
        with self._lock:
            self._iterators[request.iterator_id] = iter(dataset)
        return pb.CreateIteratorResponse(incarnation=self._incarnation)

    def RunClosure(
        self, request: pb.RunClosureRequest, context: grpc.ServicerContext
    ) -> pb.RunClosureResponse:
        if not wire.verify(self._key, request.closure, "closure"):
            refuse_payload(context, "scheduled function", self._task)
        resolved = {r.closure_id: wire.decode_value(r.value) for r in request.resolved}
        store = ClosureStore(self, resolved)
        store.required = dict(request.ps_writes)
        abandoned = threading.Event()
        context.add_callback(abandoned.set)  # the call ended: a give-up, or our own reply
        set_abandon_event(abandoned)
        try:
            response = self._run_closure(request, store)
        finally:
            set_abandon_event(None)
        response.ps_writes.update(self.writes_seen())
        return response

    def _run_closure(
        self, request: pb.RunClosureRequest, store: ClosureStore
    ) -> pb.RunClosureResponse:
        try:
            meta, fn, args, kwargs = wire.loads(request.closure, store.persistent_load)
        except _MissingIterator as exc:
            return self._error(pb.ClosureError.MISSING_ITERATOR, str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            return self._error(
                pb.ClosureError.APPLICATION,
                f"{self._task} could not unpickle the scheduled function: "
                f"{exc!r}. Functions must be importable on the workers, or "
                "pickled by value (install cloudpickle)",
                type(exc).__name__,
            )
        store.meta = meta
        strategy = self.strategy(int(meta.get("num_replicas_in_sync", 1)))
        for handle in store.handles:
            handle._strategy = strategy
            for part in getattr(handle, "_variables", ()):
                part._strategy = strategy
        frame = _context.Frame(strategy, None)
        _context.push(frame)
        try:
            result = fn(*args, **kwargs)
        except UnavailableError as exc:
            return self._error(
                pb.ClosureError.PS_UNAVAILABLE, exc.fact, "UnavailableError", exc.task or ""
            )
        except (StopIteration, OutOfRangeError) as exc:
            return self._error(
                pb.ClosureError.OUT_OF_RANGE,
                f"a per-worker iterator on {self._task} is exhausted "
                f"({type(exc).__name__}); repeat the dataset in dataset_fn, or "
                "schedule fewer steps",
                type(exc).__name__,
            )
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            return self._error(
                pb.ClosureError.APPLICATION,
                f"{type(exc).__name__}: {exc}\n\nRemote traceback "
                f"({self._task}):\n{traceback.format_exc()}",
                type(exc).__name__,
            )
        finally:
            _context.pop(frame)
        try:
            value = wire.encode_value(result)
        except TypeError as exc:
            return self._error(pb.ClosureError.APPLICATION, str(exc), "TypeError")
        return pb.RunClosureResponse(result=value, incarnation=self._incarnation)

    def _error(
        self, kind: int, message: str, exception_type: str = "", task: str = ""
    ) -> pb.RunClosureResponse:
        return pb.RunClosureResponse(
            error=pb.ClosureError(
                kind=kind, message=message, task=task, exception_type=exception_type
            ),
            incarnation=self._incarnation,
        )


def call_dataset_fn(dataset_fn: Any, input_context: InputContext) -> Any:
    """``dataset_fn(input_context)``, or ``dataset_fn()`` when it takes no argument."""
    import inspect

    try:
        params = inspect.signature(dataset_fn).parameters.values()
        takes_arg = any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
        )
    except (TypeError, ValueError):
        takes_arg = True
    return dataset_fn(input_context) if takes_arg else dataset_fn()
