"""tf.distribute.experimental names: the older MultiWorkerMirroredStrategy constructor, the
communication options, the preemption handler, and the names tf keeps here as well as at the
top level (ValueContext, ParameterServerStrategy, CentralStorageStrategy, TPUStrategy,
partitioners)."""

from __future__ import annotations

from .communication import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)
from .fault_tolerance import PreemptionCheckpointHandler, TerminationConfig
from .input_lib import ValueContext
from .multi_worker import _ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy
from .parameter_server import CentralStorageStrategy, ParameterServerStrategy, partitioners
from .tpu import TPUStrategy

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "PreemptionCheckpointHandler",
    "TPUStrategy",
    "TerminationConfig",
    "ValueContext",
    "partitioners",
]
