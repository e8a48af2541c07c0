"""Errors raised by pycollective.

Bad arguments raise :class:`ValueError` or :class:`TypeError` before any data moves. Failures
while a collective runs raise a :class:`CollectiveError` subclass whose message names the rank,
the collective and its sequence number, and says what to do. After such a failure the group is
aborted (its peers stop waiting for this rank) and must be created again.

All classes are plain exceptions with a message argument, so they pickle (they cross process
boundaries in tests and launchers).
"""

from __future__ import annotations

__all__ = [
    "CollectiveError",
    "CollectiveTimeout",
    "RemoteError",
    "ProtocolError",
    "Aborted",
    "InternalError",
    "CudaError",
    "NcclError",
    "NcclUnavailable",
]


class CollectiveError(RuntimeError):
    """A collective failed while it ran."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective did not finish before its deadline (``timeout=`` / ``PYCOLLECTIVE_TIMEOUT``)."""


class RemoteError(CollectiveError):
    """A peer closed its link, died, or failed on its side."""


class ProtocolError(CollectiveError):
    """Ranks called different collectives, or the same one with different arguments."""


class Aborted(CollectiveError):
    """The group was aborted (by :meth:`abort`, another thread, or an earlier failure)."""


class InternalError(CollectiveError):
    """A pycollective bug: an internal invariant did not hold. Please report it."""


class CudaError(CollectiveError):
    """A CUDA runtime call failed (the message names the call and the CUDA error), or device
    buffers were passed to a build or machine without CUDA."""


class NcclError(CollectiveError):
    """An NCCL call failed, or NCCL reported an asynchronous error (the message carries NCCL's
    error code, its description and NCCL's last error). The communicator was aborted."""


class NcclUnavailable(CollectiveError):
    """NCCL could not be used: the library (or one of its symbols) is missing or too old, or
    this build has no CUDA. The message lists every path tried and the loader's error for each;
    install ``nvidia-nccl-cu12``/``-cu13`` or set ``PYCOLLECTIVE_NCCL_LIBRARY``."""
