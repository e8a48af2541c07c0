"""Periodic checkpoints of a ClusterCoordinator's training, and recovery from a lost
parameter-server task (``coordinator.enable_checkpointing(checkpoint, directory, ...)``).

**Checkpoints are consistent cuts.** When one is due (every ``every_functions`` finished
functions, or every ``every_seconds``), the coordinator stops handing out functions, waits until
none runs, writes the Checkpoint (the atomic npz of checkpoint.py, numbered
``<directory>/ckpt-<n>.npz``) and goes on. Checkpoint n therefore holds exactly the updates of
the functions that finished before it, its optimizer iterations included. The first one is
written before the first function runs.

**Recovery.** When a function fails because a ps task is unavailable (it died, or it came back
empty and lacks the variables), the coordinator stops handing out functions, lets the running
ones end (those that need the task fail within the strategy's ``rpc_timeout``), then:

1. waits, at most ``restart_timeout`` seconds, until every ps task answers again. A task
   restarted on its address (``pycollective run --ps N --workers M --max-restarts K`` restarts
   it) answers with a new incarnation and holds nothing;
2. registers the optimizers again and restores the last checkpoint on *every* ps task: the
   restarted one gets its shards and optimizer state back, and the surviving ones are rolled
   back to the checkpoint too (what tf's ``Checkpoint.restore`` does), so that the model stays
   one consistent state;
3. queues again, ahead of the waiting functions, the functions that finished since the
   checkpoint (their updates were rolled back: they run again, so no update is lost; their
   RemoteValues keep their first result) and the ones the failure interrupted, and goes on.

``schedule``/``join``/``fetch`` callers see nothing of a recovery that succeeds; when one fails
(the task did not come back in time, no checkpoint, ``max_recoveries`` reached, a variable the
checkpoint does not track) they get the error, an UnavailableError naming the task for a task
that did not come back. Asynchronous training only: in synchronous training a step's gradients
wait on the ps tasks for every worker, so a pause between functions would stall the step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint import Checkpoint, NumberedCheckpoints
from .errors import UnavailableError, ps_task

if TYPE_CHECKING:
    from .coordinator import ClusterCoordinator, _Closure

logger = logging.getLogger("pycollective.strategies")

#: checkpoint files are ``<directory>/<CHECKPOINT_PREFIX>-<n>.npz``
CHECKPOINT_PREFIX = "ckpt"
_POLL_S = 0.25
_PING_S = 2.0


@dataclass(frozen=True)
class PSRecovery:
    """One recovery from a lost parameter-server task (``ClusterCoordinator.recoveries``).

    Attributes:
        task: the ps task whose failure started it, e.g. ``"/job:ps/replica:0/task:1"``.
        error: what failed.
        checkpoint: the checkpoint restored on every ps task.
        restarted: the ps tasks that came back as new processes (a new incarnation).
        replayed: functions run again: finished since the checkpoint, or interrupted.
        seconds: from when the coordinator noticed the failure until every ps task held the
            checkpoint again (waiting for the restarted task included).
    """

    task: str | None
    error: str
    checkpoint: str
    restarted: tuple[str, ...]
    replayed: int
    seconds: float


class Checkpointing(threading.Thread):
    """The coordinator's checkpoint and recovery thread (see the module docstring).

    The dispatchers and the coordinator call ``finished`` and ``lost`` with the coordinator's
    lock held; while ``hold`` is set they hand out no function.
    """

    def __init__(
        self,
        coordinator: ClusterCoordinator,
        checkpoint: Checkpoint,
        directory: str,
        *,
        every_functions: int | None,
        every_seconds: float | None,
        keep: int,
        restart_timeout: float,
        max_recoveries: int | None,
        on_recovery: Callable[[PSRecovery], Any] | None,
    ) -> None:
        super().__init__(name="pc-ps-checkpointing", daemon=True)
        if every_functions is None and every_seconds is None:
            raise ValueError("give every_functions, every_seconds or both: when to checkpoint")
        if every_functions is not None and every_functions < 1:
            raise ValueError(f"every_functions must be >= 1, got {every_functions}")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
        if not restart_timeout > 0:
            raise ValueError(f"restart_timeout must be > 0 seconds, got {restart_timeout}")
        if max_recoveries is not None and max_recoveries < 0:
            raise ValueError(f"max_recoveries must be >= 0 or None, got {max_recoveries}")
        self._coordinator = coordinator
        self.files = NumberedCheckpoints(checkpoint, directory, CHECKPOINT_PREFIX, keep)
        self.every_functions = every_functions
        self.every_seconds = every_seconds
        self.restart_timeout = float(restart_timeout)
        self.max_recoveries = max_recoveries
        self.on_recovery = on_recovery
        #: the newest checkpoint written, or None
        self.latest: str | None = None
        self.history: list[PSRecovery] = []
        on_disk = self.files.steps_on_disk()
        self._number = on_disk[-1] if on_disk else 0  # numbers go on after an earlier run's
        # Guarded by the coordinator's lock:
        self.hold = True  # no function is handed out: a checkpoint or a recovery is due
        self._save_due = True  # the first checkpoint, before the first function runs
        self._lost: UnavailableError | None = None
        self._lost_at = 0.0
        self._interrupted = 0
        self._since: list[_Closure] = []  # finished since the last checkpoint, in order
        self._last_save = time.monotonic()
        self._incarnations: dict[int, str] = {}

    # Called by the coordinator (its lock held) ------------------------------------------------

    def finished(self, closure: _Closure) -> None:
        """A function finished: its update is not in a checkpoint yet."""
        self._since.append(closure)
        if self.every_functions is not None and len(self._since) >= self.every_functions:
            self._save_due = self.hold = True

    def lost(self, error: UnavailableError, interrupted: bool = True) -> None:
        """A ps task is unavailable: a function was interrupted by it (and is queued again),
        or (``interrupted=False``) the coordinator's own call failed."""
        self._interrupted += int(interrupted)
        if self._lost is None:
            logger.warning(
                "%s is unavailable: checkpointing is on, so the coordinator pauses, waits for it "
                "and restores the last checkpoint on every ps task itself (the error: %s)",
                error.task,
                error.fact,
            )
            self._lost, self._lost_at = error, time.monotonic()
        self.hold = True

    # The thread ---------------------------------------------------------------------------------

    def run(self) -> None:
        coordinator = self._coordinator
        while True:
            with coordinator._cond:
                while True:
                    if coordinator._closed:
                        return
                    if self.hold and coordinator._inflight == 0:
                        if self._lost is not None:
                            action = self._recover
                            break
                        # The first checkpoint waits for the first function: its optimizer is
                        # registered (and its slots exist) by then.
                        if self._save_due and (self.latest is not None or coordinator._queue):
                            action = self._save
                            break
                    if (
                        self.every_seconds is not None
                        and not self.hold
                        and self._since
                        and time.monotonic() - self._last_save >= self.every_seconds
                    ):
                        self._save_due = self.hold = True
                        continue
                    coordinator._cond.wait(_POLL_S)
            action()

    def _save(self) -> None:
        coordinator = self._coordinator
        number = self._number + 1
        try:
            if coordinator._cluster and not self._incarnations:
                self._incarnations = self._ping_all()
            path = self.files.save(number)
        except UnavailableError as exc:  # a ps task failed while the checkpoint was written
            with coordinator._cond:
                self.lost(exc, interrupted=False)
            return
        except BaseException as exc:  # noqa: BLE001 - the training stops with it
            self._give_up(
                RuntimeError(f"writing checkpoint {self.files.path(number)} failed: {exc!r}")
            )
            return
        with coordinator._cond:
            self._number, self.latest = number, path
            self._since.clear()
            self._save_due = self.hold = False
            self._last_save = time.monotonic()
            coordinator._cond.notify_all()
        logger.info("checkpoint %s written", path)

    def _recover(self) -> None:
        coordinator = self._coordinator
        error = self._lost
        assert error is not None
        try:
            if self.max_recoveries is not None and len(self.history) >= self.max_recoveries:
                raise UnavailableError(
                    f"{error.task or 'a parameter server'} failed again and the coordinator "
                    f"gave up: max_recoveries={self.max_recoveries} reached. Last failure: "
                    f"{error}",
                    task=error.task,
                    address=error.address,
                )
            if self.latest is None:
                raise UnavailableError(
                    f"{error.task or 'a parameter server'} failed before the first checkpoint "
                    f"was written, so there is nothing to restore: {error}",
                    task=error.task,
                    address=error.address,
                )
            restarted = self._restore(error)
        except BaseException as exc:  # noqa: BLE001 - the training stops with it
            self._give_up(exc)
            return
        with coordinator._cond:
            replay, self._since = self._since, []
            for closure in reversed(replay):
                coordinator._queue.appendleft(closure)
            record = PSRecovery(
                task=error.task,
                error=str(error),
                checkpoint=self.latest,
                restarted=restarted,
                replayed=len(replay) + self._interrupted,
                seconds=time.monotonic() - self._lost_at,
            )
            self.history.append(record)
            self._lost, self._interrupted = None, 0
        logger.warning(
            "restored %s on every parameter server after %s failed (restarted: %s); %d "
            "function(s) run again",
            record.checkpoint,
            record.task,
            ", ".join(record.restarted) or "none",
            record.replayed,
        )
        if self.on_recovery is not None:
            try:
                self.on_recovery(record)  # nothing runs yet: it sees the restored state
            except BaseException as exc:  # noqa: BLE001 - the training stops with it
                self._give_up(RuntimeError(f"on_recovery raised {exc!r}"))
                return
        with coordinator._cond:
            self.hold = self._save_due
            coordinator._cond.notify_all()

    def _restore(self, error: UnavailableError) -> tuple[str, ...]:
        """Waits for every ps task, then restores the last checkpoint on all of them; returns
        the tasks that restarted. Another failure meanwhile starts it over, within the
        deadline."""
        ext = self._coordinator.strategy.extended
        self._check_covered(error)
        deadline = time.monotonic() + self.restart_timeout
        restarted: set[str] = set()
        while True:
            restarted.update(self._wait_for_tasks(deadline, error))
            try:
                ext.reregister_optimizers()
                status = self.files.checkpoint.restore(self.latest)
                break
            except UnavailableError as again:
                if time.monotonic() >= deadline:
                    raise
                logger.warning("restoring %s failed (%s); waiting again", self.latest, again)
                error = again
        if status.missing:
            raise RuntimeError(
                f"checkpoint {self.latest} has no value for {status.missing}: they were "
                "created after it was written, and the parameter servers are now without them"
            )
        return tuple(sorted(restarted))

    def _check_covered(self, error: UnavailableError) -> None:
        """Refuses, before any ps task is touched, a restore that would leave state the
        checkpoint does not hold: an untracked variable or optimizer would keep its newer
        values on the surviving tasks and start empty on the restarted one."""
        ext = self._coordinator.strategy.extended
        variables, optimizers = self.files.checkpoint._track()
        tracked = {id(v) for v in variables.values()}
        untracked = [v.name for v in ext.variables if id(v) not in tracked]
        tracked_optimizers = {id(o) for o in optimizers.values()}
        untracked += [
            f"optimizer {name!r}"
            for optimizer, name in ext._optimizers.values()
            if id(optimizer) not in tracked_optimizers
        ]
        if untracked:
            raise RuntimeError(
                f"{untracked} are not in the checkpoint the coordinator restores, so after "
                f"{error.task} failed their state would be lost on it and newer than the "
                "checkpoint on the other ps tasks; add them to the Checkpoint given to "
                "enable_checkpointing"
            )

    def _wait_for_tasks(self, deadline: float, error: UnavailableError) -> list[str]:
        """Pings every ps task until each answered (or the deadline: UnavailableError naming
        those that did not); returns the tasks that answered with a new incarnation."""
        ext = self._coordinator.strategy.extended
        waiting = dict(ext.ps_tasks)
        restarted = []
        while True:
            for task, address in list(waiting.items()):
                timeout = min(_PING_S, max(0.1, deadline - time.monotonic()))
                try:
                    reply = ext.client.ping(task, address, timeout)
                except UnavailableError:
                    continue
                del waiting[task]
                if self._incarnations.get(task, reply.incarnation) != reply.incarnation:
                    restarted.append(ps_task(task))
                self._incarnations[task] = reply.incarnation
            if not waiting:
                return restarted
            if time.monotonic() >= deadline or self._coordinator._closed:
                task, address = next(iter(waiting.items()))
                names = ", ".join(f"{ps_task(t)} ({a})" for t, a in waiting.items())
                raise UnavailableError(
                    f"parameter server {names} did not answer within {self.restart_timeout:g} s "
                    f"after {error.task or 'a parameter server'} failed ({error}); restart it "
                    "on the same address (pycollective run --ps N --workers M --max-restarts K "
                    f"does that). Training stopped; the last checkpoint is {self.latest}.",
                    task=ps_task(task),
                    address=address,
                )
            time.sleep(_POLL_S)

    def _ping_all(self) -> dict[int, str]:
        ext = self._coordinator.strategy.extended
        return {
            task: ext.client.ping(task, address, ext.rpc_timeout).incarnation
            for task, address in ext.ps_tasks
        }

    def _give_up(self, error: BaseException) -> None:
        """The training cannot go on: every waiting function fails with ``error``, and the
        next schedule/join/done raises it."""
        coordinator = self._coordinator
        with coordinator._cond:
            coordinator._cancel_queued(error)
            if coordinator._error is None:
                coordinator._error = error
            self._lost, self._interrupted = None, 0
            # Functions scheduled from now on start with a checkpoint if there is none yet.
            self._save_due = self.hold = self.latest is None
            coordinator._cond.notify_all()
        logger.error("%s", error)
