"""Rendezvous and control plane: who is in the group, and how ranks find each other.

Rank 0 hosts a gRPC ``CoordinationService``; every rank connects a
``CoordinationClient`` to register, read the peer table, synchronize, share
small values, and learn at once when any rank fails. ``ClusterSpec`` says
where this process stands, read from arguments or a launcher's environment.
"""

from __future__ import annotations

from .bootstrap import rendezvous
from .client import COORDINATOR_RANK, CoordinationClient, PeerInfo, RendezvousError
from .cluster import ClusterSpec
from .service import CoordinationService

__all__ = [
    "COORDINATOR_RANK",
    "ClusterSpec",
    "CoordinationClient",
    "CoordinationService",
    "PeerInfo",
    "RendezvousError",
    "rendezvous",
]
