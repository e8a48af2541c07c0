"""tf.distribute.experimental names: the older MultiWorkerMirroredStrategy constructor and the
communication options."""

from __future__ import annotations

from .communication import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)
from .multi_worker import _ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy

__all__ = [
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
]
