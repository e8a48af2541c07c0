"""Long-lived replica threads: ``strategy.run`` hands each local replica's function to its own
thread instead of starting n threads every step (starting and joining them cost about as much
as a small step's collectives).

Replica 0 runs on the caller's thread, so it sees the caller's thread-local state (a
``torch.no_grad()`` block, for instance) where replicas 1..n-1 do not, and Ctrl-C reaches
``run()`` only once replica 0's current native call returns (collectives are bounded by their
timeout). A thread still busy when the next ``run()`` starts (its function hung and ``run()``
was interrupted), or one that died, is replaced, so a stuck replica never blocks later steps.
The threads hold nothing of a step once it is done, and stop when the strategy that owns them
is garbage-collected.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable, Sequence

_log = logging.getLogger("pycollective.strategies")

_STOP = None  # queued to a worker: leave the loop


class _Worker:
    def __init__(self, name: str) -> None:
        self.tasks: queue.SimpleQueue[tuple[Callable[[], None], threading.Event] | None] = (
            queue.SimpleQueue()
        )
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def usable(self) -> bool:
        return self.thread.is_alive() and not self.busy

    def _loop(self) -> None:
        while True:
            item = self.tasks.get()
            if item is _STOP:
                return
            task, done = item
            try:
                task()  # replica functions report their own errors (strategy._run_replicas)
            except BaseException:  # noqa: BLE001 - the loop must outlive any task
                _log.exception(
                    "%s: a replica task raised outside its own error handling", self.thread.name
                )
            finally:
                self.busy = False
                done.set()
                # Nothing of the step may outlive it: the task holds the strategy, the
                # replica function, its arguments and its results.
                item = task = done = None


def _stop_all(workers: list[_Worker | None]) -> None:
    for worker in workers:
        if worker is not None:
            worker.tasks.put(_STOP)


class ReplicaThreads:
    """Threads for replicas 1..n-1 (replica 0 is the caller's thread).

    Args:
        names: one thread name per replica (names[0] is unused).
    """

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._workers: list[_Worker | None] = [None] * len(names)
        weakref.finalize(self, _stop_all, self._workers)

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Runs ``tasks[r]`` for replica r, all at once; returns when all have returned. The
        wait for replicas 1..n-1 stays interruptible; the caller then decides what to do with
        replicas still running."""
        done = []
        for r in range(1, len(tasks)):
            worker = self._workers[r]
            if worker is None or not worker.usable():
                if worker is not None:
                    worker.tasks.put(_STOP)  # a stuck one leaves once its task returns
                worker = self._workers[r] = _Worker(self._names[r])
            worker.busy = True
            event = threading.Event()
            worker.tasks.put((tasks[r], event))
            done.append(event)
        tasks[0]()
        for event in done:
            while not event.wait(0.25):
                pass
