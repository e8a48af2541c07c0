"""tf.distribute.experimental names: the older MultiWorkerMirroredStrategy constructor, the
communication options, and the preemption handler."""

from __future__ import annotations

from .communication import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)
from .fault_tolerance import PreemptionCheckpointHandler, TerminationConfig
from .multi_worker import _ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy

__all__ = [
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "PreemptionCheckpointHandler",
    "TerminationConfig",
]
