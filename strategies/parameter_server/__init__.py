"""ParameterServerStrategy: variables on parameter-server tasks, steps scheduled on workers.

Quick tour (the chief of a cluster of ps and worker tasks; see docs/parameter_server.md)::

    from pycollective.strategies import (SGD, ClusterCoordinator, FixedShardsPartitioner,
                                         ParameterServerStrategy, Variable)

    strategy = ParameterServerStrategy(variable_partitioner=FixedShardsPartitioner(2))
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        w = Variable(np.zeros((64, 10), np.float32), name="w")   # 2 shards on the ps tasks
        opt = SGD(0.1)

    def step(iterator):
        x, y = next(iterator)
        grad = ...                                   # computed on a worker
        opt.apply_gradients([(grad, w)])             # applied on the parameter servers
        return loss

    it = iter(coordinator.create_per_worker_dataset(dataset_fn))
    losses = [coordinator.schedule(step, args=(it,)) for _ in range(100)]
    coordinator.join()

Every task but the chief runs ``Server(TFConfigClusterResolver()).join()`` (``python -m
pycollective.strategies.parameter_server``); ``pycollective run --ps 2 --workers 2 python
train.py`` starts a whole cluster on this machine.
"""

from __future__ import annotations

from .coordinator import (
    ClusterCoordinator,
    PerWorkerDataset,
    PerWorkerValue,
    PerWorkerValues,
    RemoteValue,
)
from .errors import CancelledError, ClosureError, OutOfRangeError, UnavailableError
from .partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
)
from .recovery import PSRecovery
from .server import Server
from .strategy import (
    CentralStorageStrategy,
    ParameterServerStrategy,
    ParameterServerStrategyExtended,
)
from .variables import CentralVariable, ParameterServerVariable, ShardedVariable

__all__ = [
    "CancelledError",
    "CentralStorageStrategy",
    "CentralVariable",
    "ClosureError",
    "ClusterCoordinator",
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "OutOfRangeError",
    "ParameterServerStrategy",
    "ParameterServerStrategyExtended",
    "ParameterServerVariable",
    "Partitioner",
    "PerWorkerDataset",
    "PerWorkerValue",
    "PerWorkerValues",
    "PSRecovery",
    "RemoteValue",
    "Server",
    "ShardedVariable",
    "UnavailableError",
]
