"""Distributed values of TPUStrategy: per-replica results that stay on the devices, and
per-replica batches padded to one static shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..values import PerReplica


class TPUPerReplica(PerReplica):
    """Per-replica values held as one global ``jax.Array`` of shape ``(replicas, *shape)``,
    sharded over the mesh (row r lives on replica r's device).

    ``values`` are this process's replicas' rows, each a ``jax.Array`` on its own device;
    ``strategy.reduce`` and ``strategy.gather`` reduce the global array with XLA collectives
    without copying it to the host.

    ``valid_rows``: for a result of ``run`` whose axis 0 has the size of a padded batch (an
    uneven batch, see ``experimental_valid_rows``), each replica's number of real rows (a global
    int32 array ``(replicas,)``); ``reduce``/``gather`` along axis 0 leave the padding out.
    Otherwise None.
    """

    def __init__(
        self, global_array: Any, local_rows: Sequence[int], valid_rows: Any = None
    ) -> None:
        self._global = global_array
        self._rows = tuple(local_rows)
        self._cache: tuple[Any, ...] | None = None
        self.valid_rows = valid_rows

    @property
    def global_array(self) -> Any:
        return self._global

    @property
    def _values(self) -> tuple[Any, ...]:  # type: ignore[override]
        if self._cache is None:
            by_row = {s.index[0].start or 0: s.data for s in self._global.addressable_shards}
            self._cache = tuple(by_row[r][0] for r in self._rows)
        return self._cache


class PaddedPerReplica(PerReplica):
    """A per-replica batch whose components were padded with zero rows to one size
    (``experimental_distribute_dataset`` of TPUStrategy); ``valid_rows[i]`` rows of component
    ``i`` are data."""

    def __init__(self, values: Sequence[Any], valid_rows: Sequence[int]) -> None:
        super().__init__(values)
        self.valid_rows = tuple(int(n) for n in valid_rows)
