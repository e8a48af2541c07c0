"""The ``ps`` task's gRPC service: :class:`ParameterServerService` holds variables and the
optimizers' state (iterations, slots) and applies gradients with the optimizer's own update
arithmetic (the ``_update_step`` of the strategies-layer SGD/Adam), either at once (asynchronous
training) or once per step after one gradient from every worker (synchronous training,
aggregated with pycollective's native reduction)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

import pycollective as pc
from pycollective import fused_update

from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from ._service_util import abort, rebuild_optimizer, refuse_payload
from .client import CHUNK_BYTES, byte_view
from .errors import ps_task

_log = logging.getLogger("pycollective.strategies.parameter_server")

# A handler that waits (a synchronous step) answers this long before its caller's deadline so
# that the caller gets the explanation instead of a bare DEADLINE_EXCEEDED.
_ANSWER_MARGIN_S = 0.25
_MAX_WAIT_WITHOUT_DEADLINE_S = 600.0
_ASSIGN_KINDS = ("assign", "assign_add", "assign_sub")
# An update of variables that pulls are sending from waits for them at most as long as copying
# those variables would take at this speed, then copies (ski rental: never more than twice the
# cheaper of waiting and copying). A pull that keeps pace is waited for, with no copy: on a
# 2-vCPU VM over shared memory, where a pull of 64 MiB takes 6 ms, copying for every push that
# met one read pulls-while-pushing 15.9-16.9 ms against 11.7-12.7 under the old lock
# (docs/benchmarks.md, "A pull no longer holds the ps task").
_COPY_BYTES_PER_S = 4e9


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


class ParameterServerService(pb_grpc.ParameterServerServicer):
    """The state of one ps task and the RPCs over it. Every handler holds one lock while it
    touches the state; synchronous pushes wait on its condition."""

    def __init__(self, key: bytes, task_index: int, incarnation: str) -> None:
        self._key = key
        self._task_index = task_index
        self._task = ps_task(task_index)
        #: the port of the task's data plane (data_plane.DataPlaneServer), 0 while none
        self.data_port = 0
        # The write clock: advanced by every change of a variable's value (an applied update, an
        # assignment, a creation). Replies carry it, so a worker knows whether values it kept
        # are current. It starts at the wall clock in ns so that it keeps growing across
        # restarts of the task.
        self._writes = time.time_ns()
        self._incarnation = incarnation
        self._cond = threading.Condition(threading.RLock())
        self._vars: dict[str, _Var] = {}
        self._opts: dict[str, _OptimizerState] = {}
        self._sync_replicas = 1
        self._comms: dict[int, pc.LocalCommunicator] = {}
        self._pool = _BufferPool()
        # Arrays that pulls are sending from now (id -> how many), and those of them no variable
        # holds any more (an update moved it to a copy: _writable), back to the pool once the
        # last of their readers is done.
        self._pins: dict[int, int] = {}
        self._retired: set[int] = set()

    # Helpers ------------------------------------------------------------------------------------

    def _decode(
        self, tensors: Any, context: grpc.ServicerContext, copy: bool = False
    ) -> list[np.ndarray]:
        try:
            return [wire.decode_tensor(t, copy=copy) for t in tensors]
        except ValueError as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{self._task}: {exc}")
            raise  # unreachable

    def _receive(
        self, chunks: Iterator[Any], field: str, context: grpc.ServicerContext
    ) -> tuple[Any, list[np.ndarray]]:
        """Assembles a client stream (PushStream, AssignStream) into pool buffers."""
        first = next(chunks, None)
        if first is None or not first.HasField("header"):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "a stream must start with its request")
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
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{self._task}: {exc}")
        views = [byte_view(a) for a in arrays]
        received = [0] * len(arrays)
        for chunk in chunks:
            index, end = chunk.tensor, chunk.offset + len(chunk.data)
            if not 0 <= index < len(views) or chunk.offset < 0 or end > views[index].size:
                self._pool.give(arrays)
                abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self._task}: stream chunk outside its tensor",
                )
            views[index][chunk.offset : end] = np.frombuffer(chunk.data, np.uint8)
            received[index] += len(chunk.data)
        if any(r != v.size for r, v in zip(received, views)):
            self._pool.give(arrays)
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self._task}: the stream ended before every tensor was complete",
            )
        return header, arrays

    def _var(self, key: str, context: grpc.ServicerContext) -> _Var:
        var = self._vars.get(key)
        if var is None:
            abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"variable {key!r} is not on {self._task} (the task restarted and lost its "
                "variables, or they were never created here)",
            )
        return var

    def _optimizer(self, optimizer_id: str, context: grpc.ServicerContext) -> _OptimizerState:
        st = self._opts.get(optimizer_id)
        if st is None:
            abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"optimizer {optimizer_id!r} is not registered on {self._task} (the task "
                "restarted?)",
            )
        return st

    def _check_shape(
        self, key: str, shape: tuple[int, ...], value: np.ndarray, context: grpc.ServicerContext
    ) -> None:
        if value.shape != shape:
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self._task}: variable {key!r} has shape {shape}, got a tensor "
                f"of shape {value.shape}",
            )

    def _apply(self, st: _OptimizerState, keys: list[str], grads: list[np.ndarray]) -> None:
        """One optimizer step over these variables (the lock is held)."""
        opt = st.optimizer
        step = st.iterations
        lr = opt._lr(step)
        names = tuple(opt._slot_names)
        fused = opt._fused(step)
        for key, grad in zip(keys, grads):
            var = self._writable(self._vars[key])
            slots = {}
            for name in names:
                slot = st.slots.get((key, name))
                if slot is None:
                    slot = st.slots[(key, name)] = np.zeros_like(var)
                slots[name] = slot
            if grad.dtype != var.dtype:
                grad = grad.astype(var.dtype)
            if fused is not None:
                # The optimizer's rule in one native pass (no temporaries; GIL released).
                rule, hyper = fused
                tensor = fused_update.ReplicatedTensor(
                    grads=[grad],
                    copies=[var],
                    slots=[[slots[n]] for n in fused_update.RULES[rule][1]],
                )
                if fused_update.supported([tensor]):
                    fused_update.apply(rule, hyper, [tensor], check=False)
                    continue
            opt._update_step(var, grad, slots, lr, step)
        st.iterations = step + 1
        self._writes += 1

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
        _log.debug(
            "%s applied synchronous step %d from workers %s", self._task, st.version, contributors
        )
        self._cond.notify_all()

    def _withdraw(
        self,
        st: _OptimizerState,
        worker: int,
        grads: dict[str, np.ndarray],
        pooled: list[np.ndarray] | None,
    ) -> None:
        """Takes back a gradient whose push gave up waiting (the lock is held), so that the
        next step is not completed early by a failed step's gradient."""
        if st.pending.get(worker) is not grads:
            return  # the worker pushed again since (a restart): that gradient stays
        del st.pending[worker]
        if pooled:
            st.pooled[:] = [b for b in st.pooled if not any(b is p for p in pooled)]
            self._pool.give(pooled)

    # What the data plane (data_plane.py) calls --------------------------------------------------

    @property
    def task(self) -> str:
        return self._task

    @property
    def task_index(self) -> int:
        return self._task_index

    def take_buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self._pool.take(shape, dtype)

    def give_buffers(self, arrays: Any) -> None:
        self._pool.give(arrays)

    @property
    def writes(self) -> int:
        """The write clock (see __init__)."""
        with self._cond:
            return self._writes

    @contextlib.contextmanager
    def reading(self, keys: list[str], context: Any) -> Iterator[tuple[int, int, list[np.ndarray]]]:
        """Pins these variables' arrays while the caller reads them: yields ``(synchronous
        version, write clock, the variables' arrays)``, all taken at one moment. A large pull
        is sent straight from the variables' memory this way, without a copy.

        The lock is held only to take them. An update that lands meanwhile moves a pinned
        variable to a copy first (_writable), so the reader still sees every variable as it was
        when it started, and a slow reader (a worker behind a slow link, one that stopped
        reading) delays no push and no other pull; sent under the lock, a pull of 32 MiB at
        1 Gb/s held every other request of the task for 0.3 s."""
        with self._cond:
            arrays = [self._var(key, context).array for key in keys]
            version = max((st.version for st in self._opts.values()), default=0)
            writes = self._writes
            for a in arrays:
                self._pins[id(a)] = self._pins.get(id(a), 0) + 1
        try:
            yield version, writes, arrays
        finally:
            with self._cond:
                for a in arrays:
                    self._unpin(a)

    def _unpin(self, array: np.ndarray) -> None:
        left = self._pins.pop(id(array)) - 1
        if left:
            self._pins[id(array)] = left
            return
        if id(array) in self._retired:
            self._retired.discard(id(array))
            self._pool.give([array])
        self._cond.notify_all()  # an update may wait for it (_await_readers)

    def _await_readers(self, keys: Any) -> None:
        """Before an update of these variables (the lock is held, and released while waiting):
        waits for the pulls sending from them, at most as long as copying them would take
        (_COPY_BYTES_PER_S); an update after that copies what is still pinned (_writable)."""
        pinned = [v.array for v in map(self._vars.get, keys) if v is not None]
        pinned = [a for a in pinned if id(a) in self._pins]
        if not pinned:
            return
        deadline = time.monotonic() + sum(a.nbytes for a in pinned) / _COPY_BYTES_PER_S
        while any(id(a) in self._pins for a in pinned):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _retire(self, array: np.ndarray) -> None:
        """An array no variable holds any more (the lock is held): back to the pool, once no
        pull sends from it."""
        if id(array) in self._pins:
            self._retired.add(id(array))
        else:
            self._pool.give([array])

    def _writable(self, var: _Var) -> np.ndarray:
        """The variable's array, safe to change in place (the lock is held): while pulls send
        from it, the variable moves to a copy, and they keep the values they started with."""
        if id(var.array) in self._pins:
            copy = self._pool.take(var.array.shape, var.array.dtype)
            np.copyto(copy, var.array)
            self._retire(var.array)
            var.array = copy
        return var.array

    def snapshot(self, keys: list[str], context: Any) -> tuple[int, int, list[np.ndarray]]:
        """Copies of these variables as they were at one moment (reading()), in pool buffers the
        caller gives back: ``(synchronous version, write clock, copies)``."""
        snapshots: list[np.ndarray] = []
        with self.reading(keys, context) as (version, writes, arrays):
            for a in arrays:
                snapshots.append(self._pool.take(a.shape, a.dtype))
                np.copyto(snapshots[-1], a)
        return version, writes, snapshots

    def push_arrays(
        self, request: pb.PushRequest, grads: list[np.ndarray], context: Any
    ) -> pb.PushResponse:
        """Push with gradients already received into pool buffers (given back once applied)."""
        return self._push(request, grads, context, grads)

    def assign_arrays(
        self, request: pb.AssignRequest, values: list[np.ndarray], context: Any
    ) -> set[int]:
        """Assign with values already received into pool buffers; returns the ids of those it
        kept as new variables (the caller gives back the others)."""
        return self._assign(request, values, context, owned=True)

    # RPCs -------------------------------------------------------------------------------------

    def Ping(self, request: pb.PingRequest, context: grpc.ServicerContext) -> pb.PingResponse:
        return pb.PingResponse(
            incarnation=self._incarnation, job="ps", task=self._task_index, data_port=self.data_port
        )

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        with self._cond:
            arrays = [self._var(k, context).array for k in request.keys]
            tensors = [wire.encode_tensor(a) for a in arrays]  # copies, under the lock
            version = max((st.version for st in self._opts.values()), default=0)
        return pb.PullResponse(values=tensors, version=version)

    def PullStream(
        self, request: pb.PullRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.TensorChunk]:
        snapshots: list[np.ndarray] = []
        try:
            version, _, snapshots = self.snapshot(list(request.keys), context)
            yield pb.TensorChunk(
                headers=[pb.Tensor(dtype=a.dtype.str, shape=a.shape) for a in snapshots],
                version=version,
            )
            for index, snap in enumerate(snapshots):
                flat = byte_view(snap)
                for offset in range(0, flat.size, CHUNK_BYTES):
                    yield pb.TensorChunk(
                        tensor=index,
                        offset=offset,
                        data=flat[offset : offset + CHUNK_BYTES].tobytes(),
                    )
        finally:
            self._pool.give(snapshots)

    def Assign(self, request: pb.AssignRequest, context: grpc.ServicerContext) -> pb.AssignResponse:
        values = self._decode(request.values, context)
        self._assign(request, values, context, owned=False)
        return pb.AssignResponse()

    def AssignStream(
        self, chunks: Iterator[pb.AssignChunk], context: grpc.ServicerContext
    ) -> pb.AssignResponse:
        request, values = self._receive(chunks, "values", context)
        owned = self._assign(request, values, context, owned=True)
        self._pool.give([v for v in values if id(v) not in owned])
        return pb.AssignResponse()

    def _assign(
        self,
        request: pb.AssignRequest,
        values: list[np.ndarray],
        context: grpc.ServicerContext,
        owned: bool,
    ) -> set[int]:
        """Applies an assignment; returns the ids of the arrays it kept as new variables."""
        if request.kind not in _ASSIGN_KINDS:
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown assign kind {request.kind!r}; expected one of {_ASSIGN_KINDS}",
            )
        if len(request.keys) != len(values):
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.keys)} keys but {len(values)} values",
            )
        kept: set[int] = set()
        with self._cond:
            if request.kind != "assign":  # an assignment replaces a pinned array, no copy
                self._await_readers(request.keys)
            # Every key is checked before any changes: a request refused halfway would have
            # applied some keys, and the data plane, told nothing was kept, would have given a
            # received buffer that had become a variable back to the pool.
            created: dict[str, tuple[int, ...]] = {}
            for key, value in zip(request.keys, values):
                if request.create and key not in self._vars and key not in created:
                    if request.kind != "assign":
                        abort(
                            context,
                            grpc.StatusCode.INVALID_ARGUMENT,
                            "create=True needs kind 'assign'",
                        )
                    created[key] = value.shape
                elif key in created:
                    self._check_shape(key, created[key], value, context)
                else:
                    self._check_shape(key, self._var(key, context).array.shape, value, context)
            self._writes += 1
            for key, value in zip(request.keys, values):
                if key not in self._vars:  # created (checked above)
                    if owned:
                        kept.add(id(value))
                    else:
                        value = np.array(value, copy=True)
                    self._vars[key] = _Var(value, request.trainable)
                    continue
                var = self._vars[key]
                if request.kind == "assign" and owned and value.dtype == var.array.dtype:
                    # The received buffer becomes the variable; the old one serves the next.
                    var.array, old = value, var.array
                    kept.add(id(value))
                    self._retire(old)
                elif request.kind == "assign":
                    # Every element is overwritten: a pinned array need not be copied first.
                    if id(var.array) in self._pins:
                        self._retire(var.array)
                        var.array = self._pool.take(var.array.shape, var.array.dtype)
                    np.copyto(var.array, value, casting="unsafe")
                elif request.kind == "assign_add":
                    target = self._writable(var)
                    np.add(target, value, out=target, casting="unsafe")
                else:
                    target = self._writable(var)
                    np.subtract(target, value, out=target, casting="unsafe")
        return kept

    def RegisterOptimizer(
        self, request: pb.RegisterOptimizerRequest, context: grpc.ServicerContext
    ) -> pb.RegisterOptimizerResponse:
        if not wire.verify(self._key, request.spec, "optimizer"):
            refuse_payload(context, "optimizer", self._task)
        try:
            cls, state = wire.loads(request.spec)
            optimizer = rebuild_optimizer(cls, state)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self._task} cannot rebuild the optimizer: {exc!r} (its class must be "
                "importable on the ps tasks, or defined in the coordinator's __main__ with "
                "cloudpickle installed)",
            )
        with self._cond:
            st = self._opts.get(request.optimizer_id)
            if st is None:
                self._opts[request.optimizer_id] = _OptimizerState(optimizer)
            else:
                st.optimizer = optimizer
            if request.sync_replicas > 0:
                self._sync_replicas = request.sync_replicas
        return pb.RegisterOptimizerResponse()

    def GetOptimizerState(
        self, request: pb.OptimizerStateRequest, context: grpc.ServicerContext
    ) -> pb.OptimizerState:
        with self._cond:
            st = self._optimizer(request.optimizer_id, context)
            slots = []
            for key in request.keys:
                var = self._var(key, context)
                for name in st.optimizer._slot_names:
                    value = st.slots.get((key, name))
                    if value is None:
                        value = np.zeros_like(var.array)
                    slots.append(pb.SlotValue(key=key, slot=name, value=wire.encode_tensor(value)))
            return pb.OptimizerState(
                optimizer_id=request.optimizer_id, iterations=st.iterations, slots=slots
            )

    def SetOptimizerState(
        self, request: pb.OptimizerState, context: grpc.ServicerContext
    ) -> pb.SetOptimizerStateResponse:
        values = self._decode([s.value for s in request.slots], context, copy=True)
        with self._cond:
            st = self._optimizer(request.optimizer_id, context)
            if request.set_iterations:
                st.iterations = int(request.iterations)
            for sv, value in zip(request.slots, values):
                var = self._var(sv.key, context)
                self._check_shape(sv.key, var.array.shape, value, context)
                st.slots[(sv.key, sv.slot)] = value.astype(var.array.dtype, copy=False)
        return pb.SetOptimizerStateResponse()

    def SetSyncReplicas(
        self, request: pb.SetSyncReplicasRequest, context: grpc.ServicerContext
    ) -> pb.SetSyncReplicasResponse:
        with self._cond:
            self._sync_replicas = max(1, int(request.replicas))
            for st in self._opts.values():
                self._maybe_complete(st)
        return pb.SetSyncReplicasResponse()

    def Push(self, request: pb.PushRequest, context: grpc.ServicerContext) -> pb.PushResponse:
        return self._push(request, self._decode(request.gradients, context), context, None)

    def PushStream(
        self, chunks: Iterator[pb.PushChunk], context: grpc.ServicerContext
    ) -> pb.PushResponse:
        request, grads = self._receive(chunks, "gradients", context)
        return self._push(request, grads, context, grads)

    def _push(
        self,
        request: pb.PushRequest,
        grads: list[np.ndarray],
        context: grpc.ServicerContext,
        pooled: list[np.ndarray] | None,
    ) -> pb.PushResponse:
        """Applies gradients (async), or contributes them to the current synchronous step and
        waits until it is applied. ``pooled``: buffers to give back once applied."""
        if len(request.keys) != len(grads):
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.keys)} keys but {len(grads)} gradients",
            )
        keys = list(request.keys)
        with self._cond:
            if not request.synchronous:
                # Not for a synchronous step: its gradients join the step under this very hold
                # of the lock, and the step applies once (_maybe_complete), copying if need be.
                self._await_readers(keys)
            try:
                st = self._optimizer(request.optimizer_id, context)
                for key, grad in zip(keys, grads):
                    self._check_shape(key, self._var(key, context).array.shape, grad, context)
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
            mine = st.pending[request.worker] = dict(zip(keys, grads))
            if pooled:
                st.pooled.extend(pooled)
            self._maybe_complete(st)
            remaining = context.time_remaining()
            budget = (
                (remaining - _ANSWER_MARGIN_S)
                if remaining is not None
                else _MAX_WAIT_WITHOUT_DEADLINE_S
            )
            deadline = time.monotonic() + budget
            while st.version == my_version:
                left = deadline - time.monotonic()
                if left <= 0 or not context.is_active():
                    have = sorted(st.pending)
                    self._withdraw(st, request.worker, mine, pooled)
                    # ABORTED, not DEADLINE_EXCEEDED: the task answered; it is not lost.
                    abort(
                        context,
                        grpc.StatusCode.ABORTED,
                        f"synchronous step {my_version + 1} on {self._task} needs gradients "
                        f"from {self._sync_replicas} workers but got them only from workers "
                        f"{have}: schedule one function per worker for every step (worker "
                        f"{request.worker}'s gradient was withdrawn from the step)",
                    )
                self._cond.wait(min(left, 0.5))
            return pb.PushResponse(version=st.version, iterations=st.iterations)
