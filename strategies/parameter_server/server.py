"""The tasks of a parameter-server cluster: ``Server(cluster_resolver).join()``.

A ``ps`` task serves :class:`ParameterServerService`: it holds variables and the optimizers'
state (iterations, slots) and applies gradients with the optimizer's own update arithmetic
(the ``_update_step`` of the strategies-layer SGD/Adam), either at once (asynchronous
training) or once per step after one gradient from every worker (synchronous training,
aggregated with pycollective's native reduction).

A ``worker`` task serves :class:`WorkerService`: it runs the functions the coordinator
schedules. A function arrives pickled inside a signed payload; the worker checks the HMAC
before unpickling, rebuilds variable handles, the optimizer and its per-worker iterators, runs
the function (pulling variables from, and pushing gradients to, the ps tasks) and sends the
result back as tensors.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from concurrent import futures
from typing import Any

import grpc
import numpy as np

import pycollective as pc
from pycollective.rendezvous.auth import TokenInterceptor

from .. import _context
from ..backend import LocalBackend
from ..cluster_resolver import ClusterResolver, ClusterSpec, TFConfigClusterResolver
from ..cross_device_ops import AlgorithmAllReduce
from ..input_lib import InputContext
from ..strategy import Strategy, StrategyExtended
from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from .client import CHUNK_BYTES, PSClient, PullEntry, byte_view
from .errors import OutOfRangeError, UnavailableError, ps_task, worker_task
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

# A handler that waits (a synchronous step) answers this long before its caller's deadline so
# that the caller gets the explanation instead of a bare DEADLINE_EXCEEDED.
_ANSWER_MARGIN_S = 0.25
_MAX_WAIT_WITHOUT_DEADLINE_S = 600.0
_ASSIGN_KINDS = ("assign", "assign_add", "assign_sub")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    context.abort(code, message)


def _refuse_payload(context: grpc.ServicerContext, what: str, task: str) -> None:
    _log.warning("%s refused a %s payload from %s: its HMAC does not match (tampered, or signed "
                 "with another cluster token); nothing was unpickled", task, what, context.peer())
    _abort(context, grpc.StatusCode.UNAUTHENTICATED,
           f"{task} refused the {what}: its signature does not match this cluster's token "
           "(tampered message, or another PYCOLLECTIVE_TOKEN)")


# Parameter-server task ---------------------------------------------------------------------------

class _Var:
    __slots__ = ("array", "trainable")

    def __init__(self, array: np.ndarray, trainable: bool) -> None:
        self.array = array
        self.trainable = trainable


class _BufferPool:
    """Reusable arrays for streamed tensors: fresh large allocations cost a page fault per
    page, so a ps task keeps a few buffers of each shape it has seen."""

    def __init__(self, keep: int = 4) -> None:
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            free = self._free.get((shape, dtype.str))
            if free:
                return free.pop()
        return np.empty(shape, dtype)

    def give(self, arrays: Any) -> None:
        with self._lock:
            for a in arrays:
                free = self._free.setdefault((a.shape, a.dtype.str), [])
                if len(free) < self._keep:
                    free.append(a)


class _OptimizerState:
    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.iterations = 0
        self.slots: dict[tuple[str, str], np.ndarray] = {}
        # Synchronous training: the gradients of the step being collected, by worker.
        self.pending: dict[int, dict[str, np.ndarray]] = {}
        # Pool buffers holding pending gradients, given back once the step is applied.
        self.pooled: list[np.ndarray] = []
        self.version = 0


def _rebuild_optimizer(cls: type, state: dict[str, Any]) -> Any:
    """An instance of the coordinator's optimizer class with its hyperparameters (no strategy,
    no variables): what provides ``_update_step`` and ``_lr`` on the ps."""
    opt = cls.__new__(cls)
    opt.__dict__.update(state)
    opt._lock = threading.Lock()
    opt._strategy = None
    opt._scope_strategy = None
    opt._iterations = None
    opt._slots = {}
    opt._slot_order = []
    return opt


class ParameterServerService(pb_grpc.ParameterServerServicer):
    """The state of one ps task and the RPCs over it. Every handler holds one lock while it
    touches the state; synchronous pushes wait on its condition."""

    def __init__(self, key: bytes, task_index: int, incarnation: str) -> None:
        self._key = key
        self._task_index = task_index
        self._task = ps_task(task_index)
        self._incarnation = incarnation
        self._cond = threading.Condition(threading.RLock())
        self._vars: dict[str, _Var] = {}
        self._opts: dict[str, _OptimizerState] = {}
        self._sync_replicas = 1
        self._comms: dict[int, pc.LocalCommunicator] = {}
        self._pool = _BufferPool()

    # Helpers ------------------------------------------------------------------------------------

    def _decode(self, tensors: Any, context: grpc.ServicerContext, copy: bool = False
                ) -> list[np.ndarray]:
        try:
            return [wire.decode_tensor(t, copy=copy) for t in tensors]
        except ValueError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{self._task}: {exc}")
            raise  # unreachable

    def _receive(self, chunks: Iterator[Any], field: str, context: grpc.ServicerContext
                 ) -> tuple[Any, list[np.ndarray]]:
        """Assembles a client stream (PushStream, AssignStream) into pool buffers."""
        first = next(chunks, None)
        if first is None or not first.HasField("header"):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "a stream must start with its "
                   "request")
        header = first.header
        arrays: list[np.ndarray] = []
        try:
            for t in getattr(header, field):
                shape = tuple(int(d) for d in t.shape)
                if any(d < 0 for d in shape) or len(shape) > 32:
                    raise ValueError(f"invalid shape {shape}")
                arrays.append(self._pool.take(shape, wire.check_dtype(t.dtype)))
        except ValueError as exc:
            self._pool.give(arrays)
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{self._task}: {exc}")
        views = [byte_view(a) for a in arrays]
        received = [0] * len(arrays)
        for chunk in chunks:
            index, end = chunk.tensor, chunk.offset + len(chunk.data)
            if not 0 <= index < len(views) or chunk.offset < 0 or end > views[index].size:
                self._pool.give(arrays)
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"{self._task}: stream chunk outside its tensor")
            views[index][chunk.offset:end] = np.frombuffer(chunk.data, np.uint8)
            received[index] += len(chunk.data)
        if any(r != v.size for r, v in zip(received, views)):
            self._pool.give(arrays)
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"{self._task}: the stream ended before every tensor was complete")
        return header, arrays

    def _var(self, key: str, context: grpc.ServicerContext) -> _Var:
        var = self._vars.get(key)
        if var is None:
            _abort(context, grpc.StatusCode.NOT_FOUND,
                   f"variable {key!r} is not on {self._task} (the task restarted and lost its "
                   "variables, or they were never created here)")
        return var

    def _optimizer(self, optimizer_id: str, context: grpc.ServicerContext) -> _OptimizerState:
        st = self._opts.get(optimizer_id)
        if st is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                   f"optimizer {optimizer_id!r} is not registered on {self._task} (the task "
                   "restarted?)")
        return st

    def _check_shape(self, key: str, var: _Var, value: np.ndarray,
                     context: grpc.ServicerContext) -> None:
        if value.shape != var.array.shape:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"{self._task}: variable {key!r} has shape {var.array.shape}, got a tensor "
                   f"of shape {value.shape}")

    def _apply(self, st: _OptimizerState, keys: list[str], grads: list[np.ndarray]) -> None:
        """One optimizer step over these variables (the lock is held)."""
        opt = st.optimizer
        step = st.iterations
        lr = opt._lr(step)
        names = tuple(opt._slot_names)
        for key, grad in zip(keys, grads):
            var = self._vars[key].array
            slots = {}
            for name in names:
                slot = st.slots.get((key, name))
                if slot is None:
                    slot = st.slots[(key, name)] = np.zeros_like(var)
                slots[name] = slot
            if grad.dtype != var.dtype:
                grad = grad.astype(var.dtype)
            opt._update_step(var, grad, slots, lr, step)
        st.iterations = step + 1

    def _sum(self, parts: list[np.ndarray]) -> np.ndarray:
        """The sum of equally shaped gradients: pycollective's native reduction (GIL released)
        for floating-point tensors, numpy otherwise."""
        if len(parts) == 1:
            return np.array(parts[0], copy=True)
        if parts[0].dtype.kind == "f" and parts[0].size > 0:
            comm = self._comms.get(len(parts))
            if comm is None:
                comm = self._comms[len(parts)] = pc.LocalCommunicator(len(parts))
            flat = [np.ascontiguousarray(p).reshape(-1) for p in parts]
            return comm.reduce(flat, root=0, op="sum")[0].reshape(parts[0].shape)
        total = np.array(parts[0], copy=True)
        for p in parts[1:]:
            total += p
        return total

    def _maybe_complete(self, st: _OptimizerState) -> None:
        """Applies the synchronous step once enough workers contributed (the lock is held)."""
        if not st.pending or len(st.pending) < self._sync_replicas:
            return
        contributors = sorted(st.pending)
        keys: list[str] = []
        for w in contributors:
            keys.extend(k for k in st.pending[w] if k not in keys)
        mean = getattr(getattr(st.optimizer, "gradient_aggregation", None), "name", "") == "MEAN"
        grads = []
        for key in keys:
            parts = [st.pending[w][key] for w in contributors if key in st.pending[w]]
            total = self._sum(parts)
            if mean and len(parts) > 1:
                total = (total / len(parts)).astype(total.dtype, copy=False)
            grads.append(total)
        self._apply(st, keys, grads)
        st.pending.clear()
        self._pool.give(st.pooled)
        st.pooled.clear()
        st.version += 1
        _log.debug("%s applied synchronous step %d from workers %s", self._task, st.version,
                   contributors)
        self._cond.notify_all()

    # RPCs -------------------------------------------------------------------------------------

    def Ping(self, request: pb.PingRequest, context: grpc.ServicerContext) -> pb.PingResponse:
        return pb.PingResponse(incarnation=self._incarnation, job="ps", task=self._task_index)

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        with self._cond:
            arrays = [self._var(k, context).array for k in request.keys]
            tensors = [wire.encode_tensor(a) for a in arrays]  # copies, under the lock
            version = max((st.version for st in self._opts.values()), default=0)
        return pb.PullResponse(values=tensors, version=version)

    def PullStream(self, request: pb.PullRequest,
                   context: grpc.ServicerContext) -> Iterator[pb.TensorChunk]:
        snapshots: list[np.ndarray] = []
        try:
            with self._cond:
                for key in request.keys:
                    var = self._var(key, context)
                    snap = self._pool.take(var.array.shape, var.array.dtype)
                    np.copyto(snap, var.array)  # consistent: a push cannot interleave
                    snapshots.append(snap)
                version = max((st.version for st in self._opts.values()), default=0)
            yield pb.TensorChunk(headers=[pb.Tensor(dtype=a.dtype.str, shape=a.shape)
                                          for a in snapshots], version=version)
            for index, snap in enumerate(snapshots):
                flat = byte_view(snap)
                for offset in range(0, flat.size, CHUNK_BYTES):
                    yield pb.TensorChunk(tensor=index, offset=offset,
                                         data=flat[offset:offset + CHUNK_BYTES].tobytes())
        finally:
            self._pool.give(snapshots)

    def Assign(self, request: pb.AssignRequest,
               context: grpc.ServicerContext) -> pb.AssignResponse:
        values = self._decode(request.values, context)
        self._assign(request, values, context, owned=False)
        return pb.AssignResponse()

    def AssignStream(self, chunks: Iterator[pb.AssignChunk],
                     context: grpc.ServicerContext) -> pb.AssignResponse:
        request, values = self._receive(chunks, "values", context)
        owned = self._assign(request, values, context, owned=True)
        self._pool.give([v for v in values if id(v) not in owned])
        return pb.AssignResponse()

    def _assign(self, request: pb.AssignRequest, values: list[np.ndarray],
                context: grpc.ServicerContext, owned: bool) -> set[int]:
        """Applies an assignment; returns the ids of the arrays it kept as new variables."""
        if request.kind not in _ASSIGN_KINDS:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"unknown assign kind {request.kind!r}; expected one of {_ASSIGN_KINDS}")
        if len(request.keys) != len(values):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"{len(request.keys)} keys but {len(values)} values")
        kept: set[int] = set()
        with self._cond:
            for key, value in zip(request.keys, values):
                if request.create and key not in self._vars:
                    if request.kind != "assign":
                        _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                               "create=True needs kind 'assign'")
                    if owned:
                        kept.add(id(value))
                    else:
                        value = np.array(value, copy=True)
                    self._vars[key] = _Var(value, request.trainable)
                    continue
                var = self._var(key, context)
                self._check_shape(key, var, value, context)
                if request.kind == "assign":
                    np.copyto(var.array, value, casting="unsafe")
                elif request.kind == "assign_add":
                    np.add(var.array, value, out=var.array, casting="unsafe")
                else:
                    np.subtract(var.array, value, out=var.array, casting="unsafe")
        return kept

    def RegisterOptimizer(self, request: pb.RegisterOptimizerRequest,
                          context: grpc.ServicerContext) -> pb.RegisterOptimizerResponse:
        if not wire.verify(self._key, request.spec, "optimizer"):
            _refuse_payload(context, "optimizer", self._task)
        try:
            cls, state = wire.loads(request.spec)
            optimizer = _rebuild_optimizer(cls, state)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"{self._task} cannot rebuild the optimizer: {exc!r} (its class must be "
                   "importable on the ps tasks, or defined in the coordinator's __main__ with "
                   "cloudpickle installed)")
        with self._cond:
            st = self._opts.get(request.optimizer_id)
            if st is None:
                self._opts[request.optimizer_id] = _OptimizerState(optimizer)
            else:
                st.optimizer = optimizer
            if request.sync_replicas > 0:
                self._sync_replicas = request.sync_replicas
        return pb.RegisterOptimizerResponse()

    def GetOptimizerState(self, request: pb.OptimizerStateRequest,
                          context: grpc.ServicerContext) -> pb.OptimizerState:
        with self._cond:
            st = self._optimizer(request.optimizer_id, context)
            slots = []
            for key in request.keys:
                var = self._var(key, context)
                for name in st.optimizer._slot_names:
                    value = st.slots.get((key, name))
                    if value is None:
                        value = np.zeros_like(var.array)
                    slots.append(pb.SlotValue(key=key, slot=name,
                                              value=wire.encode_tensor(value)))
            return pb.OptimizerState(optimizer_id=request.optimizer_id,
                                     iterations=st.iterations, slots=slots)

    def SetOptimizerState(self, request: pb.OptimizerState,
                          context: grpc.ServicerContext) -> pb.SetOptimizerStateResponse:
        values = self._decode([s.value for s in request.slots], context, copy=True)
        with self._cond:
            st = self._optimizer(request.optimizer_id, context)
            if request.set_iterations:
                st.iterations = int(request.iterations)
            for sv, value in zip(request.slots, values):
                var = self._var(sv.key, context)
                self._check_shape(sv.key, var, value, context)
                st.slots[(sv.key, sv.slot)] = value.astype(var.array.dtype, copy=False)
        return pb.SetOptimizerStateResponse()

    def SetSyncReplicas(self, request: pb.SetSyncReplicasRequest,
                        context: grpc.ServicerContext) -> pb.SetSyncReplicasResponse:
        with self._cond:
            self._sync_replicas = max(1, int(request.replicas))
            for st in self._opts.values():
                self._maybe_complete(st)
        return pb.SetSyncReplicasResponse()

    def Push(self, request: pb.PushRequest, context: grpc.ServicerContext) -> pb.PushResponse:
        return self._push(request, self._decode(request.gradients, context), context, None)

    def PushStream(self, chunks: Iterator[pb.PushChunk],
                   context: grpc.ServicerContext) -> pb.PushResponse:
        request, grads = self._receive(chunks, "gradients", context)
        return self._push(request, grads, context, grads)

    def _push(self, request: pb.PushRequest, grads: list[np.ndarray],
              context: grpc.ServicerContext, pooled: list[np.ndarray] | None
              ) -> pb.PushResponse:
        """Applies gradients (async), or contributes them to the current synchronous step and
        waits until it is applied. ``pooled``: buffers to give back once applied."""
        if len(request.keys) != len(grads):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"{len(request.keys)} keys but {len(grads)} gradients")
        keys = list(request.keys)
        with self._cond:
            try:
                st = self._optimizer(request.optimizer_id, context)
                for key, grad in zip(keys, grads):
                    self._check_shape(key, self._var(key, context), grad, context)
            except BaseException:
                if pooled:
                    self._pool.give(pooled)
                raise
            if not request.synchronous:
                self._apply(st, keys, grads)
                if pooled:
                    self._pool.give(pooled)
                return pb.PushResponse(version=st.version, iterations=st.iterations)
            my_version = st.version
            # One gradient per worker and step: a worker that restarted replaces its own.
            st.pending[request.worker] = dict(zip(keys, grads))
            if pooled:
                st.pooled.extend(pooled)
            self._maybe_complete(st)
            remaining = context.time_remaining()
            budget = (remaining - _ANSWER_MARGIN_S) if remaining is not None \
                else _MAX_WAIT_WITHOUT_DEADLINE_S
            deadline = time.monotonic() + budget
            while st.version == my_version:
                left = deadline - time.monotonic()
                if left <= 0 or not context.is_active():
                    have = sorted(st.pending)
                    _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"synchronous step {my_version + 1} on {self._task} needs gradients "
                           f"from {self._sync_replicas} workers but got them only from workers "
                           f"{have}: schedule one function per worker for every step")
                self._cond.wait(min(left, 0.5))
            return pb.PushResponse(version=st.version, iterations=st.iterations)


# Worker task -----------------------------------------------------------------------------------------

class _MissingIterator(Exception):
    pass


class _WorkerExtended(StrategyExtended):
    def __init__(self, container: Strategy, task_index: int, num_replicas_in_sync: int) -> None:
        super().__init__(container, LocalBackend(1), AlgorithmAllReduce("auto"),
                         (f"{worker_task(task_index)}/device:CPU:0",))
        self._n_sync = num_replicas_in_sync

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._n_sync

    def _create_variable(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("variables of ParameterServerStrategy are created on the coordinator, "
                           "in strategy.scope(), not inside scheduled functions")


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

    def apply_gradients(self, grads_and_vars: Any, name: str | None = None,
                        skip_gradients_aggregation: bool = False) -> Any:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if pairs:
            self._ps_store.push(self._ps_optimizer_id, pairs)
        return self.iterations

    @property
    def iterations(self) -> IterationsVariable:
        store = self._ps_store
        return IterationsVariable(None, store.client, self._ps_optimizer_id,
                                  f"{getattr(self, 'name', 'optimizer')}/iterations",
                                  store.meta["ps"])

    def build(self, var_list: Any) -> None:
        """Slots live on the parameter servers: nothing to build here."""


class ClosureStore:
    """Variable reads and writes of one scheduled function on a worker: each variable is pulled
    at most once (all the function's variables in one call per ps task, on first use), and again
    after the function pushed to or assigned it."""

    def __init__(self, runtime: WorkerService, resolved: Mapping[int, Any]) -> None:
        self.runtime = runtime
        self.resolved = resolved
        self.meta: dict[str, Any] = {}
        self.handles: list[RemoteVariable] = []
        self.cache: dict[str, np.ndarray] = {}
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
                self.cache.update(self.client.pull(
                    [(t, a, entries) for (t, a), entries in by_task.items()],
                    timeout=self.meta.get("rpc_timeout")))
            parts = [self.cache[s.key] for s in var._shards]
        return parts[0] if len(parts) == 1 else join_rows(parts)

    def invalidate(self, keys: Any) -> None:
        with self._lock:
            for k in keys:
                self.cache.pop(k, None)

    # Writing ------------------------------------------------------------------------------------

    def write(self, var: RemoteVariable, kind: str, value: np.ndarray,
              create: bool = False) -> None:
        self.client.call_many(assign_calls(var, kind, value, create,
                                           timeout=self.meta.get("rpc_timeout")))
        self.invalidate([s.key for s in var._shards])

    def push(self, optimizer_id: str, pairs: list[tuple[Any, Any]]) -> int:
        synchronous = bool(self.meta.get("synchronous"))
        timeout = self.meta.get("sync_timeout") if synchronous else self.meta.get("rpc_timeout")
        calls = push_calls(optimizer_id, pairs, self.runtime.task_index, synchronous, timeout)
        responses = self.client.call_many(calls)
        self.invalidate([k for c in calls for k in c.request.keys])
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
                    self.task_index, num_replicas_in_sync)
            return s

    def make_handle(self, store: ClosureStore, spec: tuple) -> RemoteVariable:
        cls_name, name, shape, dtype, shards, trainable = spec
        shard_objs = [Shard(int(t), str(a), str(k), int(b), int(e), tuple(sh))
                      for t, a, k, b, e, sh in shards]
        cls = ShardedVariable if cls_name == "ShardedVariable" else ParameterServerVariable
        return cls(None, store, name, tuple(shape), dtype, shard_objs, trainable)

    def make_optimizer(self, store: ClosureStore, optimizer_id: str, cls: type,
                       state: dict[str, Any]) -> Any:
        with self._lock:
            remote_cls = self._optimizer_classes.get(cls)
            if remote_cls is None:
                remote_cls = self._optimizer_classes[cls] = type(
                    cls.__name__, (_RemoteOptimizerMixin, cls),
                    {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        opt = _rebuild_optimizer(remote_cls, state)
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

    def CreateIterator(self, request: pb.CreateIteratorRequest,
                       context: grpc.ServicerContext) -> pb.CreateIteratorResponse:
        if not wire.verify(self._key, request.dataset, "dataset"):
            _refuse_payload(context, "dataset function", self._task)
        with self._lock:
            dataset = self._datasets.get(request.dataset_id)
        if dataset is None:
            try:
                dataset_fn, num_workers, n_sync = wire.loads(request.dataset,
                                                             self._dataset_reference)
                dataset = call_dataset_fn(dataset_fn, InputContext(num_workers, self.task_index,
                                                                   n_sync))
                iter(dataset)  # fail here, not in the first closure, when it is not iterable
            except Exception as exc:  # noqa: BLE001 - reported to the coordinator
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"{self._task} could not build its dataset: "
                       f"{''.join(traceback.format_exception_only(type(exc), exc)).strip()}")
            with self._lock:
                dataset = self._datasets.setdefault(request.dataset_id, dataset)
        with self._lock:
            self._iterators[request.iterator_id] = iter(dataset)
        return pb.CreateIteratorResponse(incarnation=self._incarnation)

    def RunClosure(self, request: pb.RunClosureRequest,
                   context: grpc.ServicerContext) -> pb.RunClosureResponse:
        if not wire.verify(self._key, request.closure, "closure"):
            _refuse_payload(context, "scheduled function", self._task)
        resolved = {r.closure_id: wire.decode_value(r.value) for r in request.resolved}
        store = ClosureStore(self, resolved)
        try:
            meta, fn, args, kwargs = wire.loads(request.closure, store.persistent_load)
        except _MissingIterator as exc:
            return self._error(pb.ClosureError.MISSING_ITERATOR, str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            return self._error(pb.ClosureError.APPLICATION,
                               f"{self._task} could not unpickle the scheduled function: "
                               f"{exc!r}. Functions must be importable on the workers, or "
                               "pickled by value (install cloudpickle)", type(exc).__name__)
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
            return self._error(pb.ClosureError.PS_UNAVAILABLE, str(exc), "UnavailableError",
                               exc.task or "")
        except (StopIteration, OutOfRangeError) as exc:
            return self._error(pb.ClosureError.OUT_OF_RANGE,
                               f"a per-worker iterator on {self._task} is exhausted "
                               f"({type(exc).__name__}); repeat the dataset in dataset_fn, or "
                               "schedule fewer steps", type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            return self._error(pb.ClosureError.APPLICATION,
                               f"{type(exc).__name__}: {exc}\n\nRemote traceback "
                               f"({self._task}):\n{traceback.format_exc()}", type(exc).__name__)
        finally:
            _context.pop(frame)
        try:
            value = wire.encode_value(result)
        except TypeError as exc:
            return self._error(pb.ClosureError.APPLICATION, str(exc), "TypeError")
        return pb.RunClosureResponse(result=value, incarnation=self._incarnation)

    def _error(self, kind: int, message: str, exception_type: str = "",
               task: str = "") -> pb.RunClosureResponse:
        return pb.RunClosureResponse(
            error=pb.ClosureError(kind=kind, message=message, task=task,
                                  exception_type=exception_type),
            incarnation=self._incarnation)


def call_dataset_fn(dataset_fn: Any, input_context: InputContext) -> Any:
    """``dataset_fn(input_context)``, or ``dataset_fn()`` when it takes no argument."""
    import inspect

    try:
        params = inspect.signature(dataset_fn).parameters.values()
        takes_arg = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                        for p in params)
    except (TypeError, ValueError):
        takes_arg = True
    return dataset_fn(input_context) if takes_arg else dataset_fn()


# Server -----------------------------------------------------------------------------------------------

def _resolve_task(server_or_cluster_def: Any, job_name: str | None,
                  task_index: int | None) -> tuple[ClusterSpec, str, int]:
    if server_or_cluster_def is None:
        server_or_cluster_def = TFConfigClusterResolver()
    if isinstance(server_or_cluster_def, ClusterResolver):
        resolver = server_or_cluster_def
        spec = resolver.cluster_spec()
        job = job_name if job_name is not None else resolver.task_type
        index = task_index if task_index is not None else resolver.task_id
    else:
        spec = ClusterSpec(server_or_cluster_def)
        job, index = job_name, task_index
    if not spec:
        raise ValueError("Server needs a cluster: set TF_CONFIG (with 'ps' and 'worker' jobs), "
                         "or pass a ClusterResolver / ClusterSpec")
    if job is None or index is None:
        raise ValueError("Server needs to know which task it is: set TF_CONFIG's \"task\", or "
                         "pass job_name and task_index")
    if job not in ("ps", "worker"):
        raise ValueError(f"Server runs 'ps' and 'worker' tasks, not {job!r}: the chief runs the "
                         "coordinator program (ParameterServerStrategy + ClusterCoordinator)")
    return spec, job, int(index)


class Server:
    """An in-process server for one task of a parameter-server cluster (tf.distribute.Server).

    ``Server(cluster_resolver).join()`` runs a ps or worker task until it is stopped (or
    killed). Tasks take their addresses from the cluster spec; a port of 0 lets the OS choose
    (``address`` then holds the real one).

    Args:
        server_or_cluster_def: a ClusterResolver (default TFConfigClusterResolver()), a
            ClusterSpec or a dict of jobs.
        job_name: "ps" or "worker" (default: the resolver's task type).
        task_index: the task's index in its job (default: the resolver's task id).
        protocol: "grpc" (the only one).
        config: ignored (tf's session config).
        start: start serving now.
        token: the cluster token (default PYCOLLECTIVE_TOKEN); every task of the cluster and
            the coordinator must share it.
        max_workers: threads serving calls (a ps task needs one per waiting worker in
            synchronous training).
    """

    def __init__(self, server_or_cluster_def: Any = None, job_name: str | None = None,
                 task_index: int | None = None, protocol: str | None = None,
                 config: Any = None, start: bool = True, *, token: str | None = None,
                 max_workers: int = 32) -> None:
        if protocol not in (None, "grpc"):
            raise ValueError(f"protocol must be 'grpc', got {protocol!r}")
        self._spec, self.job_name, self.task_index = _resolve_task(server_or_cluster_def,
                                                                   job_name, task_index)
        self._token = wire.resolve_token(token)
        self._configured = self._spec.task_address(self.job_name, self.task_index)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()
        self.incarnation = uuid.uuid4().hex
        self.address = self._configured
        if start:
            self.start()

    @property
    def task(self) -> str:
        return f"/job:{self.job_name}/replica:0/task:{self.task_index}"

    @property
    def target(self) -> str:
        """``grpc://host:port`` of this task."""
        return f"grpc://{self.address}"

    def start(self) -> None:
        """Binds the task's address and starts serving."""
        if self._server is not None:
            return
        host, _, port = self._configured.rpartition(":")
        host = host.strip("[]")
        bind_host = host if host in ("127.0.0.1", "localhost", "::1") else "0.0.0.0"
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                       thread_name_prefix=f"pc-{self.job_name}"),
            interceptors=[TokenInterceptor(self._token, self.task)],
            options=wire.server_options())
        key = wire.payload_key(self._token)
        if self.job_name == "ps":
            pb_grpc.add_ParameterServerServicer_to_server(
                ParameterServerService(key, self.task_index, self.incarnation), server)
        else:
            pb_grpc.add_WorkerServicer_to_server(
                WorkerService(key, self._token, self.task_index, self.incarnation), server)
        wanted = f"{'[' + bind_host + ']' if ':' in bind_host else bind_host}:{port}"
        try:
            bound = server.add_insecure_port(wanted)
        except RuntimeError:
            bound = 0
        if bound == 0:
            server.stop(None)
            raise RuntimeError(f"{self.task} cannot listen on {wanted}: is the port in use "
                               "(another job, or a previous run still exiting)?")
        server.start()
        self._server = server
        self.address = f"{host}:{bound}"
        _log.info("%s serving on %s", self.task, self.address)

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops (or ``timeout`` seconds pass: returns False then)."""
        return self._stopped.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Stops serving; calls in flight are cancelled after ``grace`` seconds."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(timeout=(grace or 0) + 5.0)
        self._stopped.set()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Server {self.task} on {self.address}>"


def main(argv: list[str] | None = None) -> int:
    """``pycollective ps-task`` (or ``python -m pycollective.strategies.parameter_server``):
    run this process's TF_CONFIG task (ps or worker) until SIGTERM/SIGINT."""
    import argparse

    argparse.ArgumentParser(
        prog="pycollective ps-task",
        description="Runs the ps or worker task that TF_CONFIG's 'task' names (with "
                    "PYCOLLECTIVE_TOKEN, the cluster's shared secret) until SIGTERM or SIGINT. "
                    "Prints '<task> serving on <address>' once it listens.").parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    server = Server(TFConfigClusterResolver())

    def stop(signum: int, frame: Any) -> None:
        server.stop(grace=0.5)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"pycollective.parameter_server: {server.task} serving on {server.address}",
          flush=True)
    sys.stdout.flush()
    while not server.join(1.0):
        pass
    return 0
