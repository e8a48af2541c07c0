"""Work: torch's handle of an asynchronous collective, over pycollective's own handles.

A group's collectives run in issue order on the pycollective communicator's worker thread.
``wait()`` blocks on them; ``get_future()`` returns a ``torch.futures.Future`` that a single
background thread per process completes (DDP's communication hooks chain on it), so no thread
is started per call.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pycollective.errors import CollectiveError


def backend_error(exc: BaseException) -> Exception:
    """torch's DistBackendError (a RuntimeError) carrying pycollective's message, which names
    the rank, the collective and what to do."""
    return dist.DistBackendError(str(exc))


def seconds(timeout: Any) -> float | None:
    """A torch timeout (timedelta; 0 or negative meaning "unset") as seconds, or None."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


class Work(dist.Work):
    """One collective (or a few issued together) of a :class:`ProcessGroup`.

    ``handles`` are pycollective Work objects still running (empty: the call already ran on the
    caller's thread); ``outputs`` is what the future carries (the tensors written);
    ``finish`` runs once after success (copies results back into non-contiguous tensors)."""

    def __init__(self, handles: list, outputs: list, finish: Callable[[], None] | None = None):
        super().__init__()
        self._handles = handles
        self._outputs = outputs
        self._finish = finish
        self._lock = threading.Lock()
        self._error: Exception | None = None
        self._done = False
        self._future: torch.futures.Future | None = None
        if not handles:
            self._complete()

    def is_completed(self) -> bool:
        return self._done or all(h.is_completed() for h in self._handles)

    def is_success(self) -> bool:
        return self.is_completed() and self._complete(raise_error=False) is None

    def exception(self) -> Exception | None:
        return self._error

    def result(self) -> list:
        self.wait()
        return self._outputs

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Blocks until done (``timeout``: at most that long, else DistBackendError; unset: the
        collective's own deadline applies). Raises the collective's error as DistBackendError."""
        limit = seconds(timeout)
        if limit is not None and not self._done:
            deadline = time.monotonic() + limit
            for h in self._handles:
                try:
                    h.wait(max(0.0, deadline - time.monotonic()))
                except CollectiveError as exc:
                    if not h.is_completed():  # still running at the deadline: not a failure
                        raise backend_error(exc) from None
                    break  # it failed: _complete records the error
        error = self._complete(raise_error=False)
        if error is not None:
            raise error
        return True

    def get_future(self) -> torch.futures.Future:
        """A Future holding the output tensors once the collective completed (or its error)."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    self._settle_future()
                else:
                    _completer().put(self)
        return self._future

    def _complete(self, raise_error: bool = True) -> Exception | None:
        """Waits for the handles (once), runs `finish`, settles the future; returns the error."""
        with self._lock:
            if not self._done:
                try:
                    for h in self._handles:
                        h.wait()
                    if self._finish is not None:
                        self._finish()
                except CollectiveError as exc:
                    self._error = backend_error(exc)
                except Exception as exc:  # noqa: BLE001 - handed to the waiter, never lost
                    self._error = exc
                self._done = True
                self._handles = []
                if self._future is not None:
                    self._settle_future()
        if raise_error and self._error is not None:
            raise self._error
        return self._error

    def _settle_future(self) -> None:
        if self._future.done():
            return
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            self._future.set_result(self._outputs)


_queue: queue.SimpleQueue | None = None
_queue_lock = threading.Lock()


def _completer() -> queue.SimpleQueue:
    """The queue of the thread that completes futures. Works finish in issue order (one worker
    thread per communicator), so waiting for them one after another loses nothing."""
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(
                target=_complete_forever,
                args=(_queue,),
                daemon=True,
                name="pycollective-torch-futures",
            ).start()
        return _queue


def _complete_forever(q: queue.SimpleQueue) -> None:
    while (work := q.get()) is not None:
        work._complete(raise_error=False)


def stop_completer() -> None:
    """Ends the futures thread once it settled what it was given (destroy_process_group); the
    next get_future() starts a new one."""
    global _queue
    with _queue_lock:
        if _queue is not None:
            _queue.put(None)
            _queue = None
