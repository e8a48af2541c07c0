"""Sharded optimizer state (ZeRO stage 1): one worker's shard of an optimizer slot.

With ``MultiWorkerMirroredStrategy(shard_optimizer_state=True)`` every worker keeps, of each
slot (SGD's ``momentum``, Adam's ``m`` and ``v``), only the elements whose update it owns:
chunk ``worker_index`` of the variable's flattened elements split over the workers
(``pycollective.fused_update.shard_bounds``, the reduce-scatter's chunk rule: the first
``size % workers`` workers own one element more, and a worker may own none). A
:class:`ShardedSlot` holds that chunk in place of a mirrored slot variable.

Checkpoints hold whole slots, as unsharded training writes them: saving gathers the shards
(every worker calls ``save``, as it must anyway in a multi-worker job), and restoring keeps
this worker's chunk of the stored value. A checkpoint therefore restores sharded or not, under
any number of workers.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from pycollective import fused_update


class _Gatherer(Protocol):
    """What a shard needs of the strategy's collective backend (backend.CollectiveBackend)."""

    num_local_replicas: int
    num_workers: int
    worker_index: int

    def gather(self, values: list[Any], axis: int) -> list[Any]: ...


class ShardedSlot:
    """This worker's chunk of one optimizer slot of ``var``.

    Attributes:
        shard: the chunk, a 1-D numpy array (updated in place by every step).
        start, stop: the chunk's element range in the variable's flattened elements.
        name, shape, dtype: those of the whole slot (``"<var name>/<slot>"``, the variable's).
    """

    def __init__(self, var: Any, slot_name: str, backend: _Gatherer) -> None:
        self.name = f"{var.name}/{slot_name}"
        self.shape = tuple(var.shape)
        self.dtype = var.dtype
        self._backend = backend
        size = int(np.prod(self.shape, dtype=np.int64))
        self.start, self.stop = fused_update.shard_bounds(
            size, backend.num_workers, backend.worker_index
        )
        self.shard = np.zeros(self.stop - self.start, self.dtype)

    def __repr__(self) -> str:
        return (
            f"ShardedSlot({self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"worker {self._backend.worker_index} of {self._backend.num_workers} holds "
            f"elements [{self.start}, {self.stop}))"
        )

    @property
    def nbytes(self) -> int:
        """Bytes this worker keeps for the slot."""
        return int(self.shard.nbytes)

    def numpy(self) -> np.ndarray:
        """The whole slot, gathered from every worker: a collective, so every worker must call
        it (as ``Checkpoint.save`` does)."""
        return self._checkpoint_value()

    def _checkpoint_value(self) -> np.ndarray:
        # One value per local replica: the worker's shard on replica 0, nothing on the others;
        # concatenated in replica order, the workers' chunks make the whole slot.
        b = self._backend
        values = [self.shard] + [self.shard[:0]] * (b.num_local_replicas - 1)
        whole = np.asarray(b.gather(values, axis=0)[0])
        return whole.reshape(self.shape).copy()

    def _restore(self, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ValueError(
                f"cannot restore slot {self.name!r} of shape {self.shape} from a value of "
                f"shape {value.shape}"
            )
        self.shard[...] = value.reshape(-1)[self.start : self.stop]


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of optimizer slots this worker holds (every local copy of a mirrored slot; the
    shard of a sharded one); ``iterations`` is not counted."""
    total = 0
    for _, _, slot in optimizer._slot_order:
        if isinstance(slot, ShardedSlot):
            total += slot.nbytes
        else:
            total += sum(int(a.nbytes) for a in slot._arrays)
    return total
