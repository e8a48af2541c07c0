"""TPUStrategy: tf.distribute's TPU strategy on JAX/XLA (TPU cores, GPUs or host CPU devices).

Importing this package does not import JAX; creating a TPUClusterResolver or TPUStrategy does
(and says which extra to install when JAX is missing). See docs/strategies.md.
"""

from __future__ import annotations

from .cluster_resolver import TPUClusterResolver
from .step import StepTraceError, TPUReplicaContext
from .strategy import TPUExtended, TPUStrategy
from .values import PaddedPerReplica, TPUPerReplica
from .variables import TPUMirroredVariable, TPUSyncOnReadVariable

__all__ = [
    "PaddedPerReplica",
    "StepTraceError",
    "TPUClusterResolver",
    "TPUExtended",
    "TPUMirroredVariable",
    "TPUPerReplica",
    "TPUReplicaContext",
    "TPUStrategy",
    "TPUSyncOnReadVariable",
]
