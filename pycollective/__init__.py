"""pycollective: collective communication for Python with a native core.

Quick tour::

    import numpy as np
    import pycollective as pc

    comm = pc.LocalCommunicator(4)               # 4 replicas in this process
    xs = [np.full(1000, i, np.float32) for i in range(4)]
    ys = comm.allreduce(xs, op="sum", algo="ring")

See README.md and docs/ for process groups, launchers, strategies and benchmarks.
"""

from __future__ import annotations

from pycollective import log as _log  # noqa: E402,F401  (one log format, both sides)
from pycollective import nccl  # pc.nccl: NCCL communicators on CUDA devices

# First: loads the extension, or explains why it is missing (see _ext's docstring).
from pycollective._ext import _C
from pycollective.compression import ErrorFeedback, round_to_wire
from pycollective.errors import (
    Aborted,
    CollectiveError,
    CollectiveTimeout,
    CudaError,
    InternalError,
    NcclError,
    NcclUnavailable,
    ProtocolError,
    RemoteError,
)
from pycollective.local import LocalCommunicator
from pycollective.process_group import (
    PreparedCall,
    ProcessGroup,
    Work,
    allgather,
    allreduce,
    allreduce_async,
    alltoall,
    barrier,
    broadcast,
    gather,
    init,
    is_initialized,
    is_replacement,
    local_rank,
    local_size,
    new_group,
    prepare_allreduce,
    rank,
    recv,
    reduce,
    reduce_scatter,
    reinit,
    scatter,
    send,
    shutdown,
    world_size,
)
from pycollective.reduce_op import ReduceOp
from pycollective.replica_group import ReplicaGroup
from pycollective.shared_memory import shared_empty

__version__ = _C.build_info()["version"]


def build_info() -> dict:
    """What this build contains: version, compiler, flags, SIMD kernel set chosen at run time,
    CUDA yes/no (and its version and architectures)."""
    return dict(_C.build_info())


def algorithms() -> list[str]:
    """Names accepted by ``algo=``: ring, halving_doubling, hierarchical, reduce_to_one, direct,
    slots, staged, inline, auto. ``direct`` and ``inline`` need every replica in this process
    (LocalCommunicator); ``inline`` computes the collective on the calling thread. ``slots``
    and ``staged`` need a process group of exactly one host's ranks and run through their host
    segment: ``slots`` calls of at most ``PYCOLLECTIVE_HOST_SLOT_BYTES`` (16 KiB) per rank,
    ``staged`` allreduces, reduce-scatters and allgathers of any size, in pieces of
    ``PYCOLLECTIVE_HOST_PIECE_BYTES``."""
    return list(_C.algorithms())


__all__ = [
    "PreparedCall",
    "ProcessGroup",
    "Work",
    "allgather",
    "allreduce",
    "allreduce_async",
    "alltoall",
    "barrier",
    "broadcast",
    "gather",
    "init",
    "is_initialized",
    "is_replacement",
    "local_rank",
    "local_size",
    "new_group",
    "shared_empty",
    "prepare_allreduce",
    "rank",
    "reduce",
    "reduce_scatter",
    "recv",
    "reinit",
    "scatter",
    "send",
    "shutdown",
    "world_size",
    "Aborted",
    "CollectiveError",
    "CollectiveTimeout",
    "InternalError",
    "CudaError",
    "NcclError",
    "NcclUnavailable",
    "LocalCommunicator",
    "ProtocolError",
    "ReduceOp",
    "RemoteError",
    "ReplicaGroup",
    "ErrorFeedback",
    "round_to_wire",
    "algorithms",
    "nccl",
    "build_info",
]
