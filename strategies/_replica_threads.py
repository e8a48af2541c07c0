"""Long-lived replica threads: ``strategy.run`` hands each local replica's function to its own
thread instead of starting n threads every step (starting and joining them cost about as much
as a small step's collectives).

Replica 0 runs on the caller's thread. A thread still busy when the next ``run()`` starts (its
function hung, and ``run()`` was interrupted) is abandoned and replaced, so a stuck replica
never blocks later steps.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence


class _Worker:
    def __init__(self, name: str) -> None:
        self.tasks: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = \
            queue.SimpleQueue()
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            task, done = self.tasks.get()
            try:
                task()  # replica functions report their own errors (strategy._run_replicas)
            finally:
                self.busy = False
                done.set()


class ReplicaThreads:
    """Threads for replicas 1..n-1 (replica 0 is the caller's thread).

    Args:
        names: one thread name per replica (names[0] is unused).
    """

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._workers: list[_Worker | None] = [None] * len(names)

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Runs ``tasks[r]`` for replica r, all at once; returns when all have returned. The
        wait stays interruptible (Ctrl-C reaches the caller); the caller then decides what to
        do with replicas still running."""
        done = []
        for r in range(1, len(tasks)):
            worker = self._workers[r]
            if worker is None or worker.busy:
                worker = self._workers[r] = _Worker(self._names[r])
            worker.busy = True
            event = threading.Event()
            worker.tasks.put((tasks[r], event))
            done.append(event)
        tasks[0]()
        for event in done:
            while not event.wait(0.25):
                pass
