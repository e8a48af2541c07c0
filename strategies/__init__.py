"""tf.distribute-style strategies on pycollective: ``pycollective.strategies``.

Quick tour::

    import numpy as np
    from pycollective.strategies import MirroredStrategy, ReduceOp, Variable, SGD

    strategy = MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = Variable(np.zeros(3, np.float32), name="w")
        opt = SGD(learning_rate=0.1)

    def step(x):
        grad = x.mean(axis=0) - np.asarray(w)      # this replica's gradient
        opt.apply_gradients([(grad, w)])           # all-reduced (MEAN) across replicas
        return grad

    for batch in strategy.experimental_distribute_dataset(batches):
        per_replica = strategy.run(step, args=(batch,))
        print(strategy.reduce(ReduceOp.MEAN, per_replica, axis=None))

Replica functions work on numpy arrays (and on torch CPU tensors). See docs/strategies.md for
the full API and how it maps to tf.distribute.
"""

from __future__ import annotations

from . import experimental
from ._context import (
    experimental_set_strategy,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from .backend import CollectiveBackend, LocalBackend, MultiWorkerBackend
from .checkpoint import Checkpoint, CheckpointLoadStatus
from .cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    SimpleClusterResolver,
    TFConfigClusterResolver,
)
from .collective_slots import ReplicaFailed
from .communication import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)
from .cross_device_ops import (
    AlgorithmAllReduce,
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from .fault_tolerance import BackupAndRestore
from .input_lib import (
    DistributedDataset,
    DistributedIterator,
    InputContext,
    InputOptions,
    InputReplicationMode,
    ValueContext,
)
from .mirrored import MirroredStrategy
from .multi_worker import MultiWorkerMirroredStrategy
from .optimizers import SGD, Adam, Optimizer
from .reduce_util import ReduceOp
from .sharded_state import ShardedSlot
from .strategy import ReplicaContext, Strategy, StrategyExtended
from .values import DistributedValues, Mirrored, PerReplica
from .variables import (
    ComponentVariable,
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)

__all__ = [
    "SGD",
    "Adam",
    "AlgorithmAllReduce",
    "BackupAndRestore",
    "Checkpoint",
    "CheckpointLoadStatus",
    "ClusterResolver",
    "ClusterSpec",
    "CollectiveBackend",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ComponentVariable",
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "DistributedValues",
    "DistributedVariable",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "LocalBackend",
    "Mirrored",
    "MirroredStrategy",
    "MirroredVariable",
    "MultiWorkerBackend",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "Optimizer",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "ReplicaFailed",
    "ShardedSlot",
    "SimpleClusterResolver",
    "Strategy",
    "StrategyExtended",
    "SyncOnReadVariable",
    "TFConfigClusterResolver",
    "ValueContext",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "experimental",
    "experimental_set_strategy",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]

# ParameterServerStrategy (strategies/parameter_server/, docs/parameter_server.md).
from .parameter_server import (  # noqa: E402
    CentralStorageStrategy,
    ClusterCoordinator,
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    ParameterServerStrategy,
    Partitioner,
    PerWorkerValues,
    RemoteValue,
    Server,
    ShardedVariable,
)

__all__ += [
    "CentralStorageStrategy",
    "ClusterCoordinator",
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "ParameterServerStrategy",
    "Partitioner",
    "PerWorkerValues",
    "RemoteValue",
    "Server",
    "ShardedVariable",
]

# TPUStrategy (strategies/tpu/): JAX/XLA, imported lazily (pip install "pycollective[tpu]").
from .tpu import StepTraceError, TPUClusterResolver, TPUPerReplica, TPUStrategy  # noqa: E402

__all__ += ["StepTraceError", "TPUClusterResolver", "TPUPerReplica", "TPUStrategy"]
