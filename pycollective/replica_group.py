"""ReplicaGroup: the replicas of every process of the default group as one native group.

MultiWorkerMirroredStrategy with several replicas per worker needs an all-reduce over every
replica of every worker. Each process holds its replicas' native communicators (threads, as a
LocalCommunicator does) and each replica also holds links to the replicas of the same local
index in the other processes, as NCCL serves several GPUs of one process. The native
hierarchical all-reduce (csrc/algorithms/hierarchical.cc) then runs over them: a reduce-scatter
among the replicas of a process, one all-reduce per local index across processes (all of them at
once, each on its own links), an allgather among the replicas of a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pycollective import config, process_group
from pycollective._calls import wire_code
from pycollective._ext import _C
from pycollective.errors import CollectiveError
from pycollective.local import check_replica_lists, run_host
from pycollective.reduce_op import ReduceOp, parse_op


class ReplicaGroup:
    """``num_local_replicas`` replicas in this process, joined with the same number in every
    other process of the default group (``pycollective.init``): ``world_size *
    num_local_replicas`` members, global replica id ``rank * num_local_replicas + local id``.

    Every process must create it at the same point (it opens links of its own to every peer,
    with the world's transports and token). It runs ``allreduce`` (the hierarchical algorithm:
    its links are the ones that algorithm uses). When the world is aborted (a rank failed) the
    group is aborted too; a failed group stays failed (create a new one to continue).
    :meth:`close` (or a ``with`` block) releases its links and threads; every process closes it
    at the same point, once no call of it is under way anywhere.

    Args:
        num_local_replicas: replicas in this process (the same in every process).
        timeout: seconds an all-reduce may take (default: the world's).
    """

    def __init__(self, num_local_replicas: int, timeout: float | None = None) -> None:
        if not isinstance(num_local_replicas, int) or num_local_replicas < 1:
            raise ValueError(
                f"num_local_replicas must be a positive integer, got {num_local_replicas!r}"
            )
        world = process_group._default()._world
        config.reload()  # a group's start-up: the variables as they are now
        self.num_local_replicas = num_local_replicas
        self.num_workers = world.spec.world_size
        self.worker_index = world.spec.rank
        self._timeout = world.timeout if timeout is None else float(timeout)
        self._planes: list[Any] = []
        self._native: _C.LocalGroup | None = None  # None once closed
        links = []
        try:
            for _ in range(num_local_replicas):
                per_worker, plane = world.connect_again()
                links.append(per_worker)
                if plane is not None:
                    self._planes.append(plane)
            self._native = _C.LocalGroup(
                worker=self.worker_index,
                num_workers=self.num_workers,
                links=links,
                host_of_worker=world.host_of,
                timeout=self._timeout,
            )
        except BaseException:
            self._close_planes()
            raise
        self._world = world
        world.on_abort(self._abort)

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases the group's links to the other processes, its replicas' threads and, over
        grpc, its data plane, now rather than when the default group shuts down (which holds on
        to every ReplicaGroup until then). Calls after it raise ValueError. Idempotent."""
        if self._native is None:
            return
        self._world.forget_abort_callback(self._abort)
        self._native = None  # its links and executor threads go with it
        self._close_planes()

    def __repr__(self) -> str:
        return (
            f"ReplicaGroup(worker {self.worker_index}/{self.num_workers}, "
            f"{self.num_local_replicas} local replicas)"
        )

    @property
    def size(self) -> int:
        """Replicas in the group, over all processes."""
        return self.num_workers * self.num_local_replicas

    def allreduce(
        self,
        tensors: Sequence[Any],
        op: str | ReduceOp = "sum",
        inplace: bool = False,
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> list[Any]:
        """Every local replica gets the reduction over every replica of every process (one host
        tensor per local replica; ``op``, ``inplace`` and ``out`` as for
        ``LocalCommunicator.allreduce``; "avg" divides by :attr:`size`; ``compress`` as for
        ``pycollective.allreduce``: it applies to the links between processes)."""
        check_replica_lists("allreduce", self.num_local_replicas, tensors, out)
        if self._native is None:
            raise ValueError(
                f"rank {self.worker_index}: this ReplicaGroup was closed; create a new one "
                "(every process at the same point) to go on"
            )
        try:
            return run_host(
                self._native,
                "allreduce",
                tensors,
                parse_op(op),
                "hierarchical",
                0,
                inplace,
                self._timeout if timeout is None else float(timeout),
                out,
                wire_code(compress, "ReplicaGroup.allreduce"),
            )
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None

    def _abort(self, reason: str) -> None:
        if self._native is not None:
            self._native.abort(reason)
        self._close_planes()

    def _close_planes(self) -> None:
        for plane in self._planes:
            plane.close()
        self._planes = []
