"""Fault tolerance for synchronous multi-worker training: ``BackupAndRestore`` and
``PreemptionCheckpointHandler``.

Both keep numbered checkpoints of a training loop (``<prefix>-<step>.npz``) and, when a worker is
lost -- a collective fails because a peer died, froze past the timeout, or the group was aborted
-- recover *in the same processes*: the survivors re-form the process group
(``pycollective.reinit``, under an elastic launcher: ``pycollective run -n MIN:MAX``), with a
smaller world or with the replacement the launcher started, restore the newest checkpoint, and
go on from its step. A replacement builds its strategy and variables like any worker; its
strategy sees that it joins a running job and skips the initial broadcasts, and its
BackupAndRestore restores the same checkpoint the survivors restore. TensorFlow's own handlers
exit instead and leave the restart to the cluster manager.

The loop must compute step ``s`` from ``s`` alone (its batch, its learning rate), so that the
steps after a restore repeat exactly what the lost steps did. Checkpoints must be on a file
system every worker reads (one host, or a shared one); the chief writes them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import pycollective as pc
from pycollective.rendezvous import RendezvousError

from .checkpoint import Checkpoint, NumberedCheckpoints
from .collective_slots import ReplicaFailed

logger = logging.getLogger("pycollective.strategies")

#: What a lost worker looks like to the survivors.
RECOVERABLE_ERRORS: tuple[type[BaseException], ...] = (
    pc.CollectiveError,
    ReplicaFailed,
    RendezvousError,
)

#: TensorFlow's exit code for "preempted: restart me" (its PreemptionCheckpointHandler's).
PREEMPTION_EXIT_CODE = 42


@dataclass(frozen=True)
class Recovery:
    """One recovery: the step that failed, the step restored, the world after it."""

    failed_step: int
    restored_step: int
    checkpoint: str | None
    num_workers: int
    worker_index: int
    seconds: float
    error: str


class _Backups(NumberedCheckpoints):
    """Numbered checkpoints of one Checkpoint (NumberedCheckpoints), plus what recovering a
    synchronous group needs: the newest one chosen by the chief (broadcast so that every worker
    restores the same one), and re-forming the group after a failure."""

    def restore_newest(self) -> tuple[int, str | None]:
        """Restores the newest checkpoint the chief sees; (its step, its path), or (-1, None)."""
        steps = self.steps_on_disk()
        chosen = steps[-1] if steps else -1
        if pc.is_initialized() and pc.world_size() > 1:
            chosen = int(pc.broadcast(np.array([chosen], np.int64), root=0)[0])
        if chosen < 0:
            return -1, None
        path = self.path(chosen)
        self.checkpoint.restore(path)
        return chosen, path

    def rejoin(self, min_workers: int) -> None:
        strategy = self.strategy()
        rejoin = getattr(strategy, "_rejoin", None)
        if rejoin is None:
            raise TypeError(
                f"{type(strategy).__name__} cannot re-form its group; recovery in the same "
                "processes needs MultiWorkerMirroredStrategy under an elastic launcher"
            )
        rejoin(min_workers)


def is_recoverable(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a lost or failed worker."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, RECOVERABLE_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Recovering:
    """The recovery loop both handlers share."""

    _backups: _Backups
    min_workers: int
    max_recoveries: int | None
    history: list[Recovery]

    def _recover(self, error: BaseException, failed_step: int) -> int:
        """Re-forms the group and restores the newest checkpoint; returns its step. Failures
        during the recovery (another worker lost) start it over, within ``max_recoveries``."""
        while True:
            if self.max_recoveries is not None and len(self.history) >= self.max_recoveries:
                raise RuntimeError(
                    f"gave up after {len(self.history)} recoveries (max_recoveries="
                    f"{self.max_recoveries}); the last failure is the cause"
                ) from error
            start = time.monotonic()
            logger.warning("a worker was lost at step %d (%s); re-forming", failed_step, error)
            try:
                self._backups.rejoin(self.min_workers)
                step, path = self._backups.restore_newest()
            except BaseException as again:
                if not is_recoverable(again):
                    raise
                self.history.append(
                    Recovery(failed_step, -1, None, 0, -1, time.monotonic() - start, str(error))
                )
                error = again
                continue
            self.history.append(
                Recovery(
                    failed_step,
                    max(step, 0),
                    path,
                    pc.world_size(),
                    pc.rank(),
                    time.monotonic() - start,
                    str(error),
                )
            )
            logger.warning(
                "re-formed with %d workers; restored step %d from %s",
                pc.world_size(),
                max(step, 0),
                path,
            )
            return max(step, 0)


class BackupAndRestore(_Recovering):
    """Backs a training loop up every ``save_freq`` steps and, when a worker is lost, re-forms
    the group and restores the newest backup, in the same processes (tf.keras'
    ``BackupAndRestore`` for a custom loop, recovering without a restart)::

        backup = BackupAndRestore(checkpoint, "/shared/backup", save_freq=50, min_workers=2)
        backup.run(lambda step: strategy.run(train_step, args=(batch(step),)), steps=1000)

    Args:
        checkpoint: a Checkpoint of the model and optimizer (of a MultiWorkerMirroredStrategy).
        backup_dir: where backups go (every worker reads it; the chief writes).
        save_freq: steps between backups.
        delete_checkpoint: remove the backups once ``run`` completes (tf.keras' default).
        min_workers: the smallest group to go on with; fewer fails the recovery.
        max_recoveries: give up (raise) after this many recoveries; None: never.
        keep: backups kept on disk.

    Creating it restores the newest backup (a restart, or a replacement joining), or writes the
    step-0 backup if there is none: ``step`` is where the loop goes on. ``history`` lists the
    recoveries.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        backup_dir: str,
        save_freq: int = 100,
        delete_checkpoint: bool = True,
        min_workers: int = 1,
        max_recoveries: int | None = None,
        keep: int = 2,
    ) -> None:
        if save_freq < 1:
            raise ValueError(f"save_freq must be >= 1 step, got {save_freq}")
        if min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {min_workers}")
        self._backups = _Backups(checkpoint, backup_dir, "backup", keep)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self.min_workers = min_workers
        self.max_recoveries = max_recoveries
        self.history: list[Recovery] = []
        step, _ = self._backups.restore_newest()
        if step < 0:
            # Every worker restores the same state after a failure, even before the first
            # save_freq steps, and a replacement gets the chief's initial values from here.
            self._backups.save(0)
            step = 0
        self.step = step

    def run(self, step_fn: Callable[[int], Any], steps: int) -> int:
        """Calls ``step_fn(step)`` for each step from ``self.step`` to ``steps``, backing up
        every ``save_freq`` steps; a lost worker sends the loop back to the newest backup.
        Returns ``steps``."""
        while self.step < steps:
            try:
                step_fn(self.step)
                done = self.step + 1
                if done % self.save_freq == 0 or done == steps:
                    self._backups.save(done)
                self.step = done
            except BaseException as error:
                if not is_recoverable(error):
                    raise
                self.step = self._recover(error, self.step)
        if self.delete_checkpoint and self._backups.strategy().extended.should_checkpoint:
            for step in self._backups.steps_on_disk():
                os.unlink(self._backups.path(step))
        return self.step


class TerminationConfig:
    """How PreemptionCheckpointHandler learns of a preemption and what it does then
    (tf.distribute.experimental.TerminationConfig).

    Args:
        termination_watcher_fn: polled each step; True means this worker is being preempted.
            Default: a SIGTERM was received.
        exit_fn: called after the checkpoint is saved. Default: exit with code 42, which asks a
            cluster manager to restart the job.
        grace_period: seconds the platform gives between the notice and the kill (informative).
        save_fn: called instead of the checkpoint save, if given.
    """

    def __init__(
        self,
        termination_watcher_fn: Callable[[], bool] | None = None,
        exit_fn: Callable[[], Any] | None = None,
        grace_period: float | None = None,
        save_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn


class PreemptionCheckpointHandler(_Recovering):
    """Preemption and error handler for synchronous training
    (tf.distribute.experimental.PreemptionCheckpointHandler)::

        handler = PreemptionCheckpointHandler(resolver, checkpoint, "/shared/ckpt")
        while handler.total_run_calls < steps:
            handler.run(distributed_step, handler.total_run_calls)

    Creating it restores the newest checkpoint in ``checkpoint_dir``. ``run(fn, ...)`` calls
    ``fn`` and counts the call. When any worker is told it will be preempted (SIGTERM by
    default), every worker learns it at the same step (one 8-byte all-reduce per step), saves a
    checkpoint there, and exits (code 42). When a worker is lost instead, the others re-form the
    group and restore the newest checkpoint in the same processes (min_workers, under an elastic
    launcher), and ``total_run_calls`` goes back to its step; tf exits and restarts instead.

    Args:
        cluster_resolver: the strategy's cluster resolver (kept for tf's signature).
        checkpoint_or_checkpoint_manager: a Checkpoint of the model and optimizer.
        checkpoint_dir: where checkpoints go (every worker reads it; the chief writes).
        termination_config: a TerminationConfig.
        min_workers, max_recoveries: as in BackupAndRestore.
        save_freq: also save every this many calls (None: only on preemption).
    """

    def __init__(
        self,
        cluster_resolver: Any,
        checkpoint_or_checkpoint_manager: Checkpoint,
        checkpoint_dir: str | None = None,
        termination_config: TerminationConfig | None = None,
        *,
        min_workers: int = 1,
        max_recoveries: int | None = None,
        save_freq: int | None = None,
    ) -> None:
        if checkpoint_dir is None:
            raise ValueError("PreemptionCheckpointHandler needs checkpoint_dir")
        self._cluster_resolver = cluster_resolver
        self._backups = _Backups(checkpoint_or_checkpoint_manager, checkpoint_dir, "ckpt", 2)
        self._config = termination_config or TerminationConfig()
        self.min_workers = min_workers
        self.max_recoveries = max_recoveries
        self.save_freq = save_freq
        self.history: list[Recovery] = []
        self._preempted = threading.Event()
        if self._config.termination_watcher_fn is None:
            self._install_sigterm_watcher()
        step, _ = self._backups.restore_newest()
        if step < 0:
            self._backups.save(0)
            step = 0
        self._total_run_calls = step

    @property
    def total_run_calls(self) -> int:
        """Calls of ``run`` so far, across restarts (restored from the checkpoint)."""
        return self._total_run_calls

    def run(self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any):
        """Runs ``distributed_train_function(*args, **kwargs)``; saves and exits on a
        preemption; recovers from a lost worker (see the class). Returns what the function
        returned, or None when the call failed and the loop went back to a checkpoint."""
        self.save_checkpoint_if_preempted()
        try:
            result = distributed_train_function(*args, **kwargs)
            self._total_run_calls += 1
            if self.save_freq and self._total_run_calls % self.save_freq == 0:
                self._backups.save(self._total_run_calls)
            return result
        except BaseException as error:
            if not is_recoverable(error):
                raise
            self._total_run_calls = self._recover(error, self._total_run_calls)
            return None

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Saves and exits if any worker was told it will be preempted: every worker calls it
        at the same point of the loop (``run`` does, before each step)."""
        mine = self._told_preempted()
        anyone = mine
        if pc.is_initialized() and pc.world_size() > 1:
            flag = np.array([1 if mine else 0], np.int64)
            anyone = bool(pc.allreduce(flag, op="max")[0])
        if not anyone:
            return
        logger.warning("preemption at step %d: saving and exiting", self._total_run_calls)
        if self._config.save_fn is not None:
            self._config.save_fn()
        else:
            self._backups.save(self._total_run_calls)
        if pc.is_initialized():
            pc.shutdown()
        if self._config.exit_fn is not None:
            self._config.exit_fn()
        else:
            sys.exit(PREEMPTION_EXIT_CODE)

    def watch_preemption_scope(self):
        """A context manager, for tf's API: the handler watches from its creation on."""
        import contextlib

        return contextlib.nullcontext()

    def _told_preempted(self) -> bool:
        watcher = self._config.termination_watcher_fn
        return bool(watcher()) if watcher is not None else self._preempted.is_set()

    def _install_sigterm_watcher(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionCheckpointHandler watches SIGTERM, which needs the main thread: "
                "create it there, or give TerminationConfig(termination_watcher_fn=...)"
            )
        signal.signal(signal.SIGTERM, lambda signum, frame: self._preempted.set())
