"""ClusterCoordinator: schedules functions on the workers of a ParameterServerStrategy.

``schedule(fn, args, kwargs)`` pickles the function with its arguments right away (so a function
that cannot travel fails there, not later) and queues it; one dispatcher thread per worker takes
the next queued function whenever its worker is free, sends it (RunClosure, with a deadline) and
resolves the RemoteValue with the result.

Failures:

- a worker that dies or stops answering: the function it was running goes back to the front of
  the queue and runs on another worker; the dispatcher keeps pinging the worker and uses it
  again once it answers (a restarted worker rejoins; its per-worker iterators are made anew).
  In synchronous training the parameter servers are told how many workers are up, so a step
  never waits for a dead one.
- a function that raises, or a parameter server that cannot be reached: the function's
  RemoteValue raises the error, the queued functions are cancelled, and the next ``join()``,
  ``done()`` or ``schedule()`` raises it (once). A dead ps is reported within the strategy's
  ``rpc_timeout``, naming the task.
- no worker reachable for ``closure_timeout`` seconds while functions wait: they fail with
  UnavailableError. Nothing waits forever.
- with ``enable_checkpointing(checkpoint, directory, ...)``: periodic checkpoints taken between
  functions, and a lost parameter server is waited for, every ps task restored to the last
  checkpoint and the functions since then run again, without an error (recovery.py).

Without a cluster (one machine) functions run on one local thread of this process.
"""

from __future__ import annotations

import collections
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from pycollective.rendezvous import tls

from .. import _context, _nest
from ..checkpoint import Checkpoint
from ..input_lib import InputContext
from ..optimizers import Optimizer
from ..variables import DistributedVariable
from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from .client import UNREACHABLE, PSClient
from .errors import (
    CancelledError,
    ClosureError,
    OutOfRangeError,
    UnavailableError,
    worker_task,
)
from .recovery import Checkpointing, PSRecovery
from .strategy import (
    _OPTIMIZER_BOOKKEEPING,
    ParameterServerStrategy,
    ParameterServerStrategyExtended,
)
from .variables import RemoteVariable
from .worker_service import call_dataset_fn

logger = logging.getLogger("pycollective.strategies")

# A function whose worker failed this many times is given up.
MAX_ATTEMPTS = 5
_PING_TIMEOUT_S = 2.0
_IDLE_PING_S = 1.0
_RETRY_S = 0.25
_WAIT_SLICE_S = 0.25


class RemoteValue:
    """An asynchronously available value of a scheduled function.

    ``fetch()`` (or ``get()``) waits for the function and returns its result as numpy values
    (in the same nest of lists, tuples and dicts), or raises its error.
    """

    def __init__(self, coordinator: ClusterCoordinator, closure_id: int, name: str) -> None:
        self._coordinator = coordinator
        self._id = closure_id
        self._name = name
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        #: the worker task that ran the function (None until it ran)
        self.worker: str | None = None

    def _set(self, value: Any, worker: str | None) -> None:
        self._value, self.worker, self._done = value, worker, True

    def _fail(self, error: BaseException) -> None:
        if not self._done:
            self._error, self._done = error, True

    def _wait(self) -> None:
        coordinator = self._coordinator
        with coordinator._cond:
            while not self._done:
                coordinator._check_stall()
                coordinator._cond.wait(_WAIT_SLICE_S)

    def fetch(self) -> Any:
        """Wait for the result of the function and return it (numpy values)."""
        self._wait()
        if self._error is not None:
            raise self._error
        return self._value

    def get(self) -> Any:
        """Wait for the result of the function and return it (same as fetch: tensors are
        numpy arrays here)."""
        return self.fetch()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self._done else "pending"
        return f"<RemoteValue of {self._name} #{self._id}: {state}>"


class PerWorkerValues:
    """A value with one instance per worker: what ``iter(per_worker_dataset)`` returns. Passed
    to a scheduled function, it becomes the instance of the worker the function runs on."""

    def __init__(
        self, dataset: PerWorkerDataset, iterator_id: int, local: Iterator[Any] | None = None
    ) -> None:
        self._dataset = dataset
        self._iterator_id = iterator_id
        self._local = local

    def __iter__(self) -> PerWorkerValues:
        return self

    def __next__(self) -> Any:
        if self._local is not None:
            return next(self._local)
        raise TypeError(
            "a per-worker iterator is read on the workers: pass it to "
            "coordinator.schedule(fn, args=(iterator,)) and call next() in fn"
        )

    def __repr__(self) -> str:
        return f"<PerWorkerValues: iterator #{self._iterator_id} of {self._dataset!r}>"


PerWorkerValue = PerWorkerValues


class PerWorkerDataset:
    """A dataset built on every worker by ``dataset_fn`` (see
    ClusterCoordinator.create_per_worker_dataset). ``iter()`` gives per-worker iterators."""

    def __init__(
        self, coordinator: ClusterCoordinator, dataset_id: int, dataset_fn: Callable[..., Any]
    ) -> None:
        self._coordinator = coordinator
        self._id = dataset_id
        self._name = getattr(dataset_fn, "__name__", type(dataset_fn).__name__)
        self._local = None
        self.payload: pb.SignedPayload | None = None
        strategy = coordinator.strategy
        if coordinator._cluster:
            ext = strategy.extended
            n_workers = len(ext.worker_tasks)

            def hook(obj: Any) -> Any:
                if obj is strategy:
                    return ("strategy", strategy.num_replicas_in_sync)
                if isinstance(obj, (DistributedVariable, Optimizer, ClusterCoordinator)):
                    raise TypeError(
                        f"dataset_fn refers to {type(obj).__name__} {obj!r}, which "
                        "exists only on the coordinator"
                    )
                return None

            try:
                body, tensors = wire.dumps(
                    (dataset_fn, n_workers, strategy.num_replicas_in_sync), hook
                )
            except Exception as exc:
                raise TypeError(
                    f"cannot send dataset_fn {self._name!r} to the workers: {exc} "
                    f"(it is pickled with {wire.serializer_name()})"
                ) from exc
            self.payload = wire.sign(ext.payload_key, "dataset", body, tensors)
        else:
            self._local = call_dataset_fn(
                dataset_fn, InputContext(1, 0, strategy.num_replicas_in_sync)
            )

    def __iter__(self) -> PerWorkerValues:
        iterator_id = next(self._coordinator._ids)
        local = iter(self._local) if self._local is not None else None
        return PerWorkerValues(self, iterator_id, local)

    def __repr__(self) -> str:
        return f"<PerWorkerDataset #{self._id} from {self._name}>"


class _Refused(TypeError):
    """An argument that must not be sent to a worker."""


class _Closure:
    __slots__ = (
        "args",
        "attempts",
        "deps",
        "fn",
        "id",
        "iterators",
        "kwargs",
        "name",
        "payload",
        "remote_value",
    )

    def __init__(
        self,
        closure_id: int,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        remote_value: RemoteValue,
    ) -> None:
        self.id = closure_id
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.payload: pb.SignedPayload | None = None
        self.iterators: dict[int, PerWorkerValues] = {}
        self.deps: list[RemoteValue] = []
        self.remote_value = remote_value
        self.attempts = 0


class ClusterCoordinator:
    """An object to schedule and coordinate remote function execution.

    Args:
        strategy: a ParameterServerStrategy. With a cluster, functions run on its worker tasks;
            without one, on a thread of this process.
    """

    def __init__(self, strategy: ParameterServerStrategy) -> None:
        if not isinstance(strategy, ParameterServerStrategy):
            raise TypeError(
                f"ClusterCoordinator needs a ParameterServerStrategy, got {type(strategy).__name__}"
            )
        self._strategy = strategy
        self._cluster = strategy.is_cluster
        self._cond = threading.Condition(threading.RLock())
        self._queue: collections.deque[_Closure] = collections.deque()
        self._inflight = 0
        self._error: BaseException | None = None
        self._closed = False
        # Ids of functions, datasets and iterators; random high bits keep the ids of two
        # coordinators apart on workers that serve both.
        self._ids = itertools.count(secrets.randbits(30) << 32)
        self._no_worker_since: float | None = None
        self._checkpointing: Checkpointing | None = None
        if self._cluster:
            ext = strategy.extended
            assert isinstance(ext, ParameterServerStrategyExtended)
            self._dispatchers: list[Any] = [
                _WorkerDispatcher(self, ext, index, address) for index, address in ext.worker_tasks
            ]
        else:
            self._dispatchers = [_LocalDispatcher(self)]
        for d in self._dispatchers:
            d.start()

    @property
    def strategy(self) -> ParameterServerStrategy:
        """Returns the Strategy associated with the ClusterCoordinator."""
        return self._strategy

    # Checkpoints and recovery from a lost parameter server -----------------------------------------

    def enable_checkpointing(
        self,
        checkpoint: Checkpoint,
        directory: str,
        *,
        every_functions: int | None = 100,
        every_seconds: float | None = None,
        keep: int = 2,
        restart_timeout: float = 60.0,
        max_recoveries: int | None = None,
        on_recovery: Callable[[PSRecovery], Any] | None = None,
    ) -> None:
        """Checkpoints the training periodically and recovers from a lost parameter server.

        Checkpoints ``<directory>/ckpt-<n>.npz`` are taken between functions (none runs while
        one is written), the first before the first function runs. When a ps task is lost, the
        coordinator waits for it to answer again (restarted on its address), restores the last
        checkpoint on every ps task (the surviving ones are rolled back to it too), runs again
        the functions that finished since the checkpoint and those that were interrupted, and
        goes on: ``schedule``/``join`` see no error. See docs/parameter_server.md.

        Args:
            checkpoint: a Checkpoint of every variable of this strategy and the optimizers
                (e.g. ``Checkpoint(model=model, optimizer=opt)``).
            directory: where checkpoints go (created if needed).
            every_functions: checkpoint after this many finished functions (None: not by count).
            every_seconds: checkpoint when this many seconds passed since the last one and a
                function finished since (None: not by time).
            keep: checkpoint files kept on disk.
            restart_timeout: seconds a recovery waits for every ps task to answer again; then
                it fails with UnavailableError naming the task.
            max_recoveries: give up (raise) after this many recoveries; None: never.
            on_recovery: called with each PSRecovery once the checkpoint is restored, before
                functions run again. It runs on the coordinator's recovery thread while
                functions are held back, so it must not wait on them: no ``join()``,
                ``done()``, ``fetch()`` or ``schedule()`` in it (they would wait forever).

        Asynchronous training only (``update_mode="async"``).
        """
        if self._checkpointing is not None:
            raise RuntimeError("checkpointing is already enabled on this ClusterCoordinator")
        if self._strategy.update_mode != "async":
            raise ValueError(
                "enable_checkpointing needs update_mode='async': in synchronous training a "
                "step waits on the parameter servers for every worker's gradient, so pausing "
                "between functions for a checkpoint would stall the step"
            )
        checkpointing = Checkpointing(
            self,
            checkpoint,
            directory,
            every_functions=every_functions,
            every_seconds=every_seconds,
            keep=keep,
            restart_timeout=restart_timeout,
            max_recoveries=max_recoveries,
            on_recovery=on_recovery,
        )
        with self._cond:  # functions running now finish before the first checkpoint
            self._checkpointing = checkpointing
        checkpointing.start()

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest checkpoint enable_checkpointing wrote, or None."""
        return self._checkpointing.latest if self._checkpointing is not None else None

    @property
    def recoveries(self) -> list[PSRecovery]:
        """Every recovery from a lost parameter server so far (PSRecovery records)."""
        return list(self._checkpointing.history) if self._checkpointing is not None else []

    # Scheduling -----------------------------------------------------------------------------------

    def schedule(
        self, fn: Callable[..., Any], args: Any = None, kwargs: dict[str, Any] | None = None
    ) -> RemoteValue:
        """Schedules ``fn(*args, **kwargs)`` to run on a worker (whichever is free first);
        returns its RemoteValue at once. Raises the error of an earlier failed function, if
        any (once)."""
        self._raise_error()
        if self._closed:
            raise RuntimeError("this ClusterCoordinator is closed")
        if not callable(fn):
            raise TypeError(f"schedule expects a function, got {type(fn).__name__}")
        args = tuple(args) if args is not None else ()
        kwargs = dict(kwargs) if kwargs is not None else {}
        closure_id = next(self._ids)
        name = getattr(fn, "__name__", type(fn).__name__)
        rv = RemoteValue(self, closure_id, name)
        closure = _Closure(closure_id, fn, args, kwargs, rv)
        if self._cluster:
            self._pack(closure)
        with self._cond:
            self._queue.append(closure)
            self._cond.notify_all()
        return rv

    def _pack(self, closure: _Closure) -> None:
        strategy = self._strategy
        ext = strategy.extended
        assert isinstance(ext, ParameterServerStrategyExtended)

        def hook(obj: Any) -> Any:
            if isinstance(obj, RemoteVariable):
                if obj.distribute_strategy is not strategy:
                    raise _Refused(f"variable {obj.name!r} belongs to another strategy")
                return ("variable", obj._spec())
            if obj is strategy:
                return ("strategy", strategy.num_replicas_in_sync)
            if isinstance(obj, Optimizer):
                optimizer_id = ext.register_optimizer(obj)
                state = {k: v for k, v in obj.__dict__.items() if k not in _OPTIMIZER_BOOKKEEPING}
                return ("optimizer", optimizer_id, type(obj), state)
            if isinstance(obj, PerWorkerValues):
                if obj._dataset._coordinator is not self:
                    raise _Refused("a per-worker iterator of another ClusterCoordinator")
                closure.iterators[obj._iterator_id] = obj
                return ("iterator", obj._iterator_id)
            if isinstance(obj, RemoteValue):
                closure.deps.append(obj)
                return ("remote_value", obj._id)
            if isinstance(
                obj,
                (ClusterCoordinator, PerWorkerDataset, PSClient, ParameterServerStrategyExtended),
            ):
                raise _Refused(
                    f"a scheduled function cannot use the {type(obj).__name__} (it "
                    "exists only on the coordinator); pass iter(per_worker_dataset) "
                    "instead of the dataset"
                )
            if isinstance(obj, DistributedVariable):
                raise _Refused(
                    f"variable {obj.name!r} was not created in this "
                    "ParameterServerStrategy's scope()"
                )
            return None

        meta = {
            "closure_id": closure.id,
            "ps": ext.ps_tasks,
            "rpc_timeout": ext.rpc_timeout,
            "sync_timeout": ext.sync_timeout,
            "synchronous": ext.update_mode == "sync",
            "num_replicas_in_sync": strategy.num_replicas_in_sync,
        }
        try:
            body, tensors = wire.dumps((meta, closure.fn, closure.args, closure.kwargs), hook)
        except (_Refused, UnavailableError):  # a ps task did not take the optimizer
            raise
        except Exception as exc:
            raise TypeError(
                f"cannot send {closure.name!r} and its arguments to the workers: "
                f"{exc!r} (pickled with {wire.serializer_name()}; module-level "
                "functions of importable modules always work)"
            ) from exc
        closure.payload = wire.sign(ext.payload_key, "closure", body, tensors)

    def create_per_worker_dataset(self, dataset_fn: Callable[..., Any]) -> PerWorkerDataset:
        """Create dataset on each worker: ``dataset_fn(input_context)`` (or ``dataset_fn()``)
        runs on every worker (again on a restarted one) and returns an iterable of batches;
        ``iter()`` of the result gives per-worker iterators to pass to scheduled functions."""
        if isinstance(dataset_fn, PerWorkerDataset):
            return dataset_fn
        if not callable(dataset_fn):
            raise TypeError(
                "create_per_worker_dataset expects a function dataset_fn("
                "input_context) returning an iterable of batches"
            )
        return PerWorkerDataset(self, next(self._ids), dataset_fn)

    def fetch(self, val: Any) -> Any:
        """Blocking call to fetch results from the remote values (a nest of RemoteValues)."""
        return _nest.map_structure(lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    # Waiting ----------------------------------------------------------------------------------------

    def join(self) -> None:
        """Blocks until all the scheduled functions have finished execution; raises the first
        error of a failed function (once)."""
        with self._cond:
            while (self._queue or self._inflight) and self._error is None:
                self._check_stall()
                self._cond.wait(_WAIT_SLICE_S)
        self._raise_error()

    def done(self) -> bool:
        """Returns whether all the scheduled functions have finished execution (raises the
        error of a failed one)."""
        self._raise_error()
        with self._cond:
            return not self._queue and not self._inflight

    def close(self) -> None:
        """Stops the dispatcher threads (queued functions are cancelled)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cancel_queued(CancelledError("the ClusterCoordinator was closed"))
            self._cond.notify_all()
        for d in self._dispatchers:
            d.join(timeout=_PING_TIMEOUT_S + 1.0)
        if self._checkpointing is not None:
            self._checkpointing.join(timeout=_PING_TIMEOUT_S + 1.0)

    shutdown = close

    def __enter__(self) -> ClusterCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Bookkeeping (dispatchers) -------------------------------------------------------------------------

    def _raise_error(self) -> None:
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _holding(self) -> bool:
        """(lock held) Whether functions wait: a checkpoint or a recovery is due."""
        return self._checkpointing is not None and self._checkpointing.hold

    def _take(self, timeout: float) -> _Closure | None:
        with self._cond:
            if (not self._queue or self._holding()) and not self._closed:
                self._cond.wait(timeout)
            if self._closed or not self._queue or self._holding():
                return None
            self._inflight += 1
            return self._queue.popleft()

    def _finish(
        self,
        closure: _Closure,
        value: Any = None,
        error: BaseException | None = None,
        worker: str | None = None,
    ) -> None:
        with self._cond:
            self._inflight -= 1
            if error is None:
                if not closure.remote_value._done:  # a function run again keeps its first result
                    closure.remote_value._set(value, worker)
                if self._checkpointing is not None:
                    self._checkpointing.finished(closure)
            else:
                self._failed(closure, error)
            self._cond.notify_all()

    def _failed(self, closure: _Closure, error: BaseException) -> None:
        """A function failed for good (the lock is held): the functions queued behind it are
        cancelled, as tf's coordinator does, and join() raises the first such error."""
        closure.remote_value._fail(error)
        if isinstance(error, CancelledError):
            return
        if self._error is None:
            self._error = error
        self._cancel_queued(
            CancelledError(f"cancelled because {closure.name!r} #{closure.id} failed: {error}")
        )

    def _requeue(self, closure: _Closure, why: str, count: bool = True) -> None:
        with self._cond:
            self._inflight -= 1
            if count:
                closure.attempts += 1
            if closure.attempts >= MAX_ATTEMPTS:
                error = UnavailableError(
                    f"{closure.name!r} #{closure.id} failed on "
                    f"{closure.attempts} workers; last: {why}"
                )
                self._failed(closure, error)
            elif self._closed:
                closure.remote_value._fail(CancelledError("the ClusterCoordinator was closed"))
            else:
                self._queue.appendleft(closure)
            self._cond.notify_all()

    def _ps_lost(self, closure: _Closure, error: UnavailableError) -> bool:
        """A function failed because a ps task is unavailable. With checkpointing on, it is
        queued again and a recovery starts (returns True); otherwise returns False."""
        with self._cond:
            if self._checkpointing is None or self._closed:
                return False
            self._inflight -= 1
            self._queue.appendleft(closure)
            self._checkpointing.lost(error)
            self._cond.notify_all()
        return True

    def _requeue_behind_deps(self, closure: _Closure) -> None:
        """Puts back a function whose inputs are not ready: right behind the last of them
        still queued (at the front when they are all running)."""
        with self._cond:
            self._inflight -= 1
            ids = {dep._id for dep in closure.deps}
            position = 0
            for i, queued in enumerate(self._queue):
                if queued.id in ids:
                    position = i + 1
            self._queue.insert(position, closure)
            self._cond.notify_all()

    def _cancel_queued(self, error: BaseException) -> None:
        while self._queue:
            self._queue.popleft().remote_value._fail(error)

    def _workers_changed(self) -> None:
        """Called by a dispatcher whose worker went up or down."""
        up = [d for d in self._dispatchers if d.state == "alive"]
        not_dead = [d for d in self._dispatchers if d.state != "dead"]
        with self._cond:
            if up:
                self._no_worker_since = None
            elif self._no_worker_since is None:
                self._no_worker_since = time.monotonic()
            self._cond.notify_all()
        if self._cluster:
            self._strategy.extended.set_sync_replicas(max(1, len(not_dead)))

    def _check_stall(self) -> None:
        """(lock held) Fails the queued functions when no worker answered for
        closure_timeout seconds."""
        if not self._cluster or not self._queue or self._no_worker_since is None:
            return
        limit = self._strategy.extended.closure_timeout
        if time.monotonic() - self._no_worker_since < limit:
            return
        tasks = ", ".join(f"{worker_task(d.index)} ({d.address})" for d in self._dispatchers)
        error = UnavailableError(
            f"no worker answered for {limit:g} s (workers: {tasks}); "
            f"{len(self._queue)} scheduled function(s) cannot run"
        )
        self._cancel_queued(error)
        if self._error is None:
            self._error = error
        self._cond.notify_all()


class _WorkerDispatcher(threading.Thread):
    """Feeds one worker task: one function at a time, pings while it is down or idle."""

    def __init__(
        self,
        coordinator: ClusterCoordinator,
        ext: ParameterServerStrategyExtended,
        index: int,
        address: str,
    ) -> None:
        super().__init__(name=f"pc-dispatch-worker-{index}", daemon=True)
        self.coordinator = coordinator
        self.ext = ext
        self.index = index
        self.address = address
        self.task = worker_task(index)
        self.state = "starting"
        self.incarnation: str | None = None
        self._iterators: set[int] = set()
        self._metadata = wire.metadata(ext.token)
        self._channel = tls.channel(address, options=wire.channel_options())
        self._stub = pb_grpc.WorkerStub(self._channel)

    def run(self) -> None:
        coordinator = self.coordinator
        started = time.monotonic()
        last_contact = time.monotonic()
        try:
            while not coordinator._closed:
                if self.state != "alive":
                    if self._ping():
                        self._set_state("alive")
                        last_contact = time.monotonic()
                    else:
                        if (
                            self.state == "starting"
                            and time.monotonic() - started > self.ext.rpc_timeout
                        ):
                            self._set_state(
                                "dead", f"did not answer for {self.ext.rpc_timeout:g} s"
                            )
                        with coordinator._cond:
                            if not coordinator._closed:
                                coordinator._cond.wait(_RETRY_S)
                    continue
                closure = coordinator._take(_IDLE_PING_S)
                if closure is None:
                    if time.monotonic() - last_contact > _IDLE_PING_S:
                        if self._ping():
                            last_contact = time.monotonic()
                        else:
                            self._set_state("dead", "stopped answering pings")
                    continue
                self._run(closure)
                last_contact = time.monotonic()
        finally:
            self._channel.close()

    def _ping(self) -> bool:
        try:
            resp = self._stub.Ping(
                pb.PingRequest(),
                timeout=_PING_TIMEOUT_S,
                metadata=self._metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError:
            return False
        if resp.incarnation != self.incarnation:
            if self.incarnation is not None:
                logger.warning("%s (%s) restarted: it rejoins the cluster", self.task, self.address)
            self.incarnation = resp.incarnation
            self._iterators.clear()
        return True

    def _deps_ready(self, closure: _Closure) -> bool:
        """Waits a little for the functions whose results ``closure`` takes; never long, so
        that this worker can run those functions itself when they come back to the queue."""
        deadline = time.monotonic() + _RETRY_S
        with self.coordinator._cond:
            while not all(dep._done for dep in closure.deps):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.coordinator._cond.wait(left)
        return True

    def _set_state(self, state: str, why: str = "") -> None:
        if state == self.state:
            return
        previous, self.state = self.state, state
        if state == "dead":
            logger.warning(
                "%s (%s) is unavailable (%s): its functions run on the other workers "
                "until it answers again",
                self.task,
                self.address,
                why,
            )
        elif previous == "dead":
            logger.warning("%s (%s) is back", self.task, self.address)
        self.coordinator._workers_changed()

    def _run(self, closure: _Closure) -> None:
        coordinator = self.coordinator
        try:
            if not self._deps_ready(closure):
                coordinator._requeue_behind_deps(closure)
                return
            resolved = []
            for dep in closure.deps:
                if dep._error is not None:
                    coordinator._finish(
                        closure,
                        error=CancelledError(
                            f"{closure.name!r} #{closure.id} takes the result of {dep._name!r} "
                            f"#{dep._id}, which failed: {dep._error}"
                        ),
                    )
                    return
                resolved.append(
                    pb.ResolvedValue(closure_id=dep._id, value=wire.encode_value(dep._value))
                )
            for iterator_id, per_worker in closure.iterators.items():
                if iterator_id not in self._iterators:
                    dataset = per_worker._dataset
                    self._stub.CreateIterator(
                        pb.CreateIteratorRequest(
                            dataset_id=dataset._id, iterator_id=iterator_id, dataset=dataset.payload
                        ),
                        timeout=self.ext.rpc_timeout,
                        metadata=self._metadata,
                    )
                    self._iterators.add(iterator_id)
            response = self._stub.RunClosure(
                pb.RunClosureRequest(
                    closure_id=closure.id,
                    closure=closure.payload,
                    resolved=resolved,
                    # Values the worker kept from older writes than these are read again.
                    ps_writes=self.ext.client.writes_seen(),
                ),
                timeout=self.ext.closure_timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = wire.rpc_detail(exc)
            if code in UNREACHABLE or code == grpc.StatusCode.UNKNOWN:
                self._set_state("dead", detail)
                coordinator._requeue(closure, f"{self.task}: {detail}")
                return
            if code == grpc.StatusCode.UNAUTHENTICATED:
                error: BaseException = PermissionError(
                    f"{self.task} refused {closure.name!r}: {detail}"
                )
            else:
                error = RuntimeError(f"{self.task} failed {closure.name!r}: {detail}")
            coordinator._finish(closure, error=error)
            return
        except BaseException as exc:  # noqa: BLE001 - never lose a closure
            coordinator._finish(closure, error=exc)
            return
        if response.incarnation and response.incarnation != self.incarnation:
            self.incarnation = response.incarnation
        self.ext.client.observe_writes(response.ps_writes)
        kind = response.WhichOneof("outcome")
        if kind == "result":
            try:
                value = wire.decode_value(response.result)
            except ValueError as exc:
                coordinator._finish(closure, error=exc)
                return
            coordinator._finish(closure, value=value, worker=self.task)
            return
        err = response.error
        if err.kind == pb.ClosureError.MISSING_ITERATOR:
            self._iterators.clear()
            coordinator._requeue(closure, err.message, count=False)
            return
        if err.kind == pb.ClosureError.PS_UNAVAILABLE:
            # The worker sends what happened; what to do depends on this side: with
            # checkpointing on the coordinator recovers by itself, else the program must.
            error = UnavailableError(
                err.message,
                task=err.task or None,
                advice="If it died, restart it and restore the last checkpoint "
                "(Checkpoint.restore), or turn on coordinator.enable_checkpointing to have the "
                "coordinator do it.",
            )
            if coordinator._ps_lost(closure, error):
                return
        elif err.kind == pb.ClosureError.OUT_OF_RANGE:
            error = OutOfRangeError(err.message)
        else:
            error = ClosureError(
                f"{closure.name!r} failed on {self.task}: {err.message}",
                err.exception_type,
                self.task,
            )
        coordinator._finish(closure, error=error)


class _LocalDispatcher(threading.Thread):
    """One machine: runs the functions on this thread, in this process."""

    def __init__(self, coordinator: ClusterCoordinator) -> None:
        super().__init__(name="pc-dispatch-local", daemon=True)
        self.coordinator = coordinator
        self.state = "alive"
        self.index = 0
        self.address = "localhost"

    def run(self) -> None:
        coordinator = self.coordinator
        strategy = coordinator.strategy
        while not coordinator._closed:
            closure = coordinator._take(_IDLE_PING_S)
            if closure is None:
                continue
            frame = _context.Frame(strategy, None)
            _context.push(frame)
            try:
                args = _resolve_local(closure.args)
                kwargs = _resolve_local(closure.kwargs)
                value = closure.fn(*args, **kwargs)
            except StopIteration as exc:
                coordinator._finish(
                    closure, error=OutOfRangeError(f"a per-worker iterator is exhausted ({exc!r})")
                )
            except BaseException as exc:  # noqa: BLE001 - raised by fetch/join
                coordinator._finish(closure, error=exc)
            else:
                coordinator._finish(closure, value=value, worker="localhost")
            finally:
                _context.pop(frame)


def _resolve_local(structure: Any) -> Any:
    if isinstance(structure, PerWorkerValues):
        return structure._local
    if isinstance(structure, RemoteValue):
        return structure.fetch()
    if isinstance(structure, tuple) and type(structure) is tuple:
        return tuple(_resolve_local(x) for x in structure)
    if isinstance(structure, list):
        return [_resolve_local(x) for x in structure]
    if isinstance(structure, dict):
        return {k: _resolve_local(v) for k, v in structure.items()}
    return structure
