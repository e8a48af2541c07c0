"""TPUStrategy's input: global batches split across replicas and padded to one static shape.

A compiled SPMD program has one shape per argument on every replica. A global batch of ``B``
rows is split as every strategy splits it (``split_bounds``: the first ``B % N`` replicas get
one more row), and each replica's part is padded with zero rows to ``ceil(B / N)`` rows, the same
size on every replica of every process. The replica function learns how many rows are real from
``get_replica_context().experimental_valid_rows``. When ``B`` divides evenly nothing is padded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _nest, _tensors
from ..input_lib import DistributedDataset, DistributedIterator, _batch_len, split_bounds
from .values import PaddedPerReplica


def pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """``x`` with zero rows appended on axis 0 up to ``rows``."""
    if x.shape[0] == rows:
        return x
    pad = np.zeros((rows - x.shape[0],) + x.shape[1:], dtype=x.dtype)
    return np.concatenate([x, pad], axis=0)


class TPUDistributedDataset(DistributedDataset):
    """A dataset of global batches, split across all replicas along axis 0 and padded (see the
    module docstring). Every leaf of an element becomes a :class:`PaddedPerReplica`."""

    def __iter__(self) -> DistributedIterator:
        it = iter(self._dataset)
        extended = self._strategy.extended
        n_sync = self._strategy.num_replicas_in_sync
        first = extended._first_replica_id
        n_local = extended._num_local_replicas

        def next_fn() -> Any:
            element = next(it)
            leaves = [np.asarray(_tensors.to_numpy(x)) for x in _nest.flatten(element)]
            if not leaves:
                raise ValueError("a dataset element has no arrays")
            lengths = {_batch_len(x, "experimental_distribute_dataset") for x in leaves}
            if len(lengths) != 1:
                raise ValueError(
                    f"the arrays of one dataset element have different batch sizes "
                    f"{sorted(lengths)}; they must agree on axis 0"
                )
            total = lengths.pop()
            rows = -(-total // n_sync)
            bounds = split_bounds(total, n_sync)[first : first + n_local]
            valid = [stop - start for start, stop in bounds]
            out = [
                PaddedPerReplica([pad_rows(x[start:stop], rows) for start, stop in bounds], valid)
                for x in leaves
            ]
            return _nest.pack_sequence_as(element, out)

        return DistributedIterator(next_fn)
