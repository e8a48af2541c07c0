"""MultiWorkerMirroredStrategy: synchronous training across worker processes.

Each worker process runs the same program. Within a worker, replicas are threads (like
MirroredStrategy); across workers, a pycollective process group carries the reduction. The
cross-replica reduction is hierarchical (:class:`.backend.MultiWorkerBackend`): the local
replicas are reduced with the LocalCommunicator, the one reduced buffer is all-reduced across
workers (``pycollective.allreduce``), and the result is broadcast back to the local replicas.
"""

from __future__ import annotations

import logging
from typing import Any

import pycollective as pc
from pycollective import config as _config

from .backend import LocalBackend, MultiWorkerBackend
from .cluster_resolver import (
    ClusterResolver,
    TFConfigClusterResolver,
    collective_members,
)
from .communication import CommunicationImplementation, CommunicationOptions
from .cross_device_ops import AlgorithmAllReduce, host_algorithm
from .mirrored import canonical_cpu_device
from .strategy import Strategy, StrategyExtended

logger = logging.getLogger("pycollective.strategies")


def _process_group_ready() -> bool:
    is_initialized = getattr(pc, "is_initialized", None)
    if callable(is_initialized):
        return bool(is_initialized())
    try:
        pc.world_size()
    except Exception:  # noqa: BLE001 - not initialized yet
        return False
    return True


class CollectiveAllReduceExtended(StrategyExtended):
    """Implementation of MultiWorkerMirroredStrategy (its ``extended``)."""


class MultiWorkerMirroredStrategy(Strategy):
    """A distribution strategy for synchronous training on multiple workers.

    Args:
        cluster_resolver: optional ClusterResolver; default TFConfigClusterResolver (reads
            TF_CONFIG). Without TF_CONFIG, or with a cluster of one task, there is a single
            worker and no process group is needed.
        communication_options: optional CommunicationOptions: the implementation (RING, NCCL
            -- which falls back to the ring on CPU replicas -- or AUTO), ``timeout_seconds``,
            and ``bytes_per_pack`` for fused all-reduces.
        shard_optimizer_state: ZeRO stage 1 (default False). Each worker keeps only its
            1/N chunk of every optimizer slot (SGD's momentum, Adam's m and v), and each step
            reduce-scatters the gradients, updates this worker's chunk of the variables and
            slots, and allgathers the variables: one pipelined ring per step, costing about
            what the all-reduce of the gradients costs. For mirrored float32/float64 variables with
            SGD or Adam (a TypeError says so otherwise). Checkpoints hold whole slots and
            restore sharded or not, under any number of workers. With one worker it changes
            nothing. Every worker must pass the same value.

    With several workers, this process joins pycollective's process group (``pycollective.init``
    from the environment that ``pycollective run`` or TF_CONFIG describes) unless it is
    already initialized; the chief (or worker 0) is rank 0. Without TF_CONFIG, a process
    group this process already joined (``pycollective.init()`` under any launcher) supplies
    the workers. Each worker has
    ``PYCOLLECTIVE_CPU_REPLICAS`` local replicas (default 1, as tf runs one CPU replica per
    worker).
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
        shard_optimizer_state: bool = False,
    ) -> None:
        if not isinstance(shard_optimizer_state, bool):
            raise TypeError(
                f"shard_optimizer_state must be True or False, got {shard_optimizer_state!r}"
            )
        if shard_optimizer_state and communication_options is not None:
            if communication_options.compress is not None:
                raise ValueError(
                    "shard_optimizer_state=True sends each worker's updated variables, not "
                    "gradients, in one fused collective that has no compressed form: drop "
                    "CommunicationOptions(compress=...) or shard_optimizer_state"
                )
        resolver = cluster_resolver if cluster_resolver is not None else TFConfigClusterResolver()
        options = (
            communication_options if communication_options is not None else CommunicationOptions()
        )
        if not isinstance(options, CommunicationOptions):
            raise TypeError(
                f"communication_options must be a CommunicationOptions, got "
                f"{type(options).__name__}"
            )
        if isinstance(resolver, TFConfigClusterResolver):
            resolver.validate()
        self._cluster_resolver = resolver
        spec = resolver.cluster_spec()
        members = collective_members(spec)
        task_type, task_id = resolver.task_type, resolver.task_id
        num_workers = max(len(members), 1)
        _config.reload()  # a strategy's start-up: the variables as they are now
        if (
            num_workers == 1
            and cluster_resolver is None
            and not _process_group_ready()
            and _config.text("PYCOLLECTIVE_ELASTIC_STORE")
        ):
            pc.init()  # an elastic job (pycollective run -n MIN:MAX): whoever joins is the group
        adopt_group = (
            num_workers == 1
            and cluster_resolver is None
            and _process_group_ready()
            and pc.world_size() > 1
        )
        if adopt_group:
            # No TF_CONFIG, but this process already joined a process group (e.g. under
            # torchrun): its workers are the group's ranks.
            num_workers, rank = pc.world_size(), pc.rank()
            task_type, task_id = "worker", rank
        elif num_workers > 1:
            if (task_type, task_id) not in members:
                raise ValueError(
                    f"MultiWorkerMirroredStrategy runs on the chief and worker tasks, but this "
                    f"process is task {task_type!r} #{task_id}; the collective group is "
                    f"{members}"
                )
            rank = members.index((task_type, task_id))
        else:
            rank = 0
        _config.reload()  # a strategy's start-up: the variables as they are now
        local = _config.env_int("PYCOLLECTIVE_CPU_REPLICAS", 0) or 1
        algorithm = host_algorithm(options.implementation) or "auto"
        if num_workers > 1:
            if not adopt_group:
                self._join_process_group(resolver, spec, members, rank, num_workers, options)
        joining_running_job = False
        if num_workers > 1 or adopt_group:
            # A replacement joining an elastic job's re-formed group: the others' variables are
            # ahead of its own initial values and come from their checkpoint (BackupAndRestore,
            # PreemptionCheckpointHandler), which the survivors do not broadcast again.
            joining_running_job = pc.is_replacement()
            backend = MultiWorkerBackend(
                local,
                algorithm,
                options.timeout_seconds,
                worker_index=rank,
                num_workers=num_workers,
                compress=options.compress,
                error_feedback=options.error_feedback,
            )
        else:
            backend = LocalBackend(local, algorithm, options.timeout_seconds)
        job = task_type or "worker"
        devices = tuple(canonical_cpu_device(i, job=job, task=task_id or 0) for i in range(local))
        extended = CollectiveAllReduceExtended(
            self, backend, AlgorithmAllReduce(algorithm), devices, options
        )
        extended._shard_optimizer_state = shard_optimizer_state and num_workers > 1
        extended._broadcast_initial_values = not joining_running_job
        super().__init__(extended)
        logger.info(
            "MultiWorkerMirroredStrategy: worker %d of %d, %d local replicas, algorithm %s%s",
            rank,
            num_workers,
            local,
            algorithm,
            ", optimizer state sharded" if extended._shard_optimizer_state else "",
        )

    @staticmethod
    def _join_process_group(
        resolver: ClusterResolver,
        spec: Any,
        members: list,
        rank: int,
        num_workers: int,
        options: CommunicationOptions,
    ) -> None:
        if not hasattr(pc, "init"):
            raise RuntimeError(
                "MultiWorkerMirroredStrategy with several workers needs pycollective process "
                "groups (pycollective.init), which this build of pycollective does not have yet"
            )
        if not _process_group_ready():
            if (
                isinstance(resolver, TFConfigClusterResolver)
                and resolver._task_type is None
                and resolver._task_id is None
            ):
                pc.init()  # from the environment: pycollective run, TF_CONFIG, ...
            else:
                job, index = members[0]
                pc.init(rank=rank, world_size=num_workers, master=spec.task_address(job, index))
        if pc.world_size() != num_workers or pc.rank() != rank:
            raise RuntimeError(
                f"the pycollective process group has rank {pc.rank()} of {pc.world_size()}, "
                f"but the cluster resolver says rank {rank} of {num_workers}; initialize the "
                "process group from the same cluster description"
            )

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """Returns the cluster resolver associated with this strategy."""
        return self._cluster_resolver

    def _rejoin(self, min_workers: int) -> None:
        """After a worker was lost: leaves the failed process group, joins the one the
        survivors (and any replacement) form (``pycollective.reinit``), and runs on it from
        now on, with its world size and this worker's new index. Variables keep their values;
        the caller restores a checkpoint next (strategies/fault_tolerance.py)."""
        extended = self.extended
        if extended._shard_optimizer_state:
            raise RuntimeError(
                "a sharded optimizer state (shard_optimizer_state=True) is split over the "
                "workers that were lost; re-forming the group needs whole slots on each worker"
            )
        old = extended._backend
        group = pc.reinit(min_size=min_workers)
        extended._backend = MultiWorkerBackend(
            old.num_local_replicas,
            old.algorithm,
            old.timeout,
            worker_index=group.rank,
            num_workers=group.size,
            compress=getattr(old, "compress", None),
            error_feedback=getattr(old, "_feedback", None) is not None,
        )
        logger.warning(
            "MultiWorkerMirroredStrategy: re-formed the group: worker %d of %d",
            group.rank,
            group.size,
        )


class _ExperimentalMultiWorkerMirroredStrategy(MultiWorkerMirroredStrategy):
    """tf.distribute.experimental.MultiWorkerMirroredStrategy(communication=AUTO,
    cluster_resolver=None): the older constructor."""

    def __init__(
        self,
        communication: CommunicationImplementation = CommunicationImplementation.AUTO,
        cluster_resolver: ClusterResolver | None = None,
    ) -> None:
        super().__init__(
            cluster_resolver=cluster_resolver,
            communication_options=CommunicationOptions(implementation=communication),
        )
