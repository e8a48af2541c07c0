"""Errors of ParameterServerStrategy, named after tf.errors where tf has one.

All are pickleable (they keep their extra attributes), so they survive a trip between processes.
"""

from __future__ import annotations


class UnavailableError(RuntimeError):
    """A parameter server (or every worker) could not be reached, or a parameter server lost its
    state because it restarted.

    Attributes:
        task: the task that failed, e.g. ``"/job:ps/replica:0/task:1"`` (None when no single
            task is to blame).
        address: its ``host:port``, when known.
        fact: what happened, without the advice on what to do (the message is the fact, then
            the advice): a coordinator that recovers by itself logs only the fact.
    """

    def __init__(
        self,
        message: str,
        task: str | None = None,
        address: str | None = None,
        advice: str = "",
    ) -> None:
        super().__init__(f"{message} {advice}" if advice else message)
        self.fact = message
        self.task = task
        self.address = address
        self._advice = advice

    def __reduce__(self):
        return (type(self), (self.fact, self.task, self.address, self._advice))


class OutOfRangeError(RuntimeError):
    """A scheduled function called ``next()`` on an exhausted per-worker iterator."""


class CancelledError(RuntimeError):
    """A scheduled function was cancelled before it ran, because an earlier one failed."""


class ClosureError(RuntimeError):
    """A scheduled function raised on a worker. The message holds the remote traceback.

    Attributes:
        exception_type: the name of the exception class raised on the worker.
        worker: the worker task it ran on.
    """

    def __init__(self, message: str, exception_type: str = "", worker: str = "") -> None:
        super().__init__(message)
        self.exception_type = exception_type
        self.worker = worker

    def __reduce__(self):
        return (type(self), (str(self), self.exception_type, self.worker))


def ps_task(index: int) -> str:
    """The tf device-style name of parameter-server task ``index``."""
    return f"/job:ps/replica:0/task:{index}"


def worker_task(index: int) -> str:
    """The tf device-style name of worker task ``index``."""
    return f"/job:worker/replica:0/task:{index}"
