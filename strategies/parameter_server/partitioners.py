"""Partitioners: how many shards a variable is split into (tf.distribute.experimental.partitioners).

``partitioner(shape, dtype, axis=0)`` returns the number of partitions along each axis, e.g.
``[2, 1]``: two shards along axis 0. Only axis 0 is ever split, as in tf. Shard ``i`` of ``k``
gets ``ceil`` or ``floor`` of ``shape[0] / k`` rows, the bigger shards first (numpy's
``array_split``), and shards go to the parameter servers round-robin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def _shape_dtype(shape: Any, dtype: Any) -> tuple[tuple[int, ...], np.dtype]:
    shape = tuple(int(d) for d in shape)
    if not shape:
        raise ValueError("a scalar cannot be partitioned")
    return shape, np.dtype(dtype)


def _element_size(dtype: np.dtype, bytes_per_string: int) -> int:
    return bytes_per_string if dtype.kind in "SUO" else dtype.itemsize


class Partitioner:
    """Partitioner base class: all partitioners inherit from this class.

    Subclasses implement ``__call__(shape, dtype, axis=0)`` returning a list with the number of
    partitions for each axis of ``shape`` (1 for every axis but ``axis``).
    """

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """Partitioner that allocates a fixed number of shards (at most one per row).

    Args:
        num_shards: the number of shards.
    """

    def __init__(self, num_shards: int) -> None:
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
        self._num_shards = num_shards

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        dims, _ = _shape_dtype(shape, dtype)
        result = [1] * len(dims)
        result[axis] = max(1, min(self._num_shards, dims[axis]))
        return result

    def __repr__(self) -> str:
        return f"FixedShardsPartitioner(num_shards={self._num_shards})"


class MinSizePartitioner(Partitioner):
    """Partitioner that allocates a minimum size per shard.

    As many shards as keep each one at least ``min_shard_bytes`` bytes, at most ``max_shards``
    (and at most one per row).

    Args:
        min_shard_bytes: minimum bytes of each shard (default 256 KiB).
        max_shards: upper bound of the number of shards.
        bytes_per_string: assumed size of one string element.
    """

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        if min_shard_bytes < 1:
            raise ValueError(f"min_shard_bytes must be positive, got {min_shard_bytes}")
        if max_shards < 1:
            raise ValueError(f"max_shards must be positive, got {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"bytes_per_string must be positive, got {bytes_per_string}")
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        dims, dt = _shape_dtype(shape, dtype)
        total = int(np.prod(dims, dtype=np.int64)) * _element_size(dt, self._bytes_per_string)
        partitions = total / self._min_shard_bytes
        result = [1] * len(dims)
        result[axis] = max(1, min(dims[axis], self._max_shards, math.ceil(partitions)))
        return result

    def __repr__(self) -> str:
        return (
            f"MinSizePartitioner(min_shard_bytes={self._min_shard_bytes}, "
            f"max_shards={self._max_shards})"
        )


class MaxSizePartitioner(Partitioner):
    """Partitioner that keeps shards below ``max_shard_bytes``.

    As few shards as keep each one at most ``max_shard_bytes`` bytes (a row is never split, so a
    row bigger than that gets a shard of its own), at most ``max_shards`` when given.

    Args:
        max_shard_bytes: maximum bytes of each shard.
        max_shards: optional upper bound of the number of shards.
        bytes_per_string: assumed size of one string element.
    """

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        if max_shard_bytes < 1:
            raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
        if max_shards is not None and max_shards < 1:
            raise ValueError(f"max_shards must be positive, got {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"bytes_per_string must be positive, got {bytes_per_string}")
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        dims, dt = _shape_dtype(shape, dtype)
        result = [1] * len(dims)
        if dims[axis] == 0:
            return result
        row_elements = int(np.prod(dims, dtype=np.int64)) / dims[axis]
        bytes_per_slice = row_elements * _element_size(dt, self._bytes_per_string)
        slices_per_shard = (
            max(1, math.floor(self._max_shard_bytes / bytes_per_slice))
            if bytes_per_slice > 0
            else dims[axis]
        )
        shards = math.ceil(dims[axis] / slices_per_shard)
        if self._max_shards:
            shards = min(self._max_shards, shards)
        result[axis] = max(1, shards)
        return result

    def __repr__(self) -> str:
        return (
            f"MaxSizePartitioner(max_shard_bytes={self._max_shard_bytes}, "
            f"max_shards={self._max_shards})"
        )


def shard_rows(rows: int, num_shards: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` rows of each shard: the first ``rows % num_shards`` shards get
    one row more."""
    base, extra = divmod(rows, num_shards)
    bounds, start = [], 0
    for i in range(num_shards):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
