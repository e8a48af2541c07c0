"""Distributed input: splitting global batches across replicas, or one pipeline per worker.

A *dataset* here is any iterable of batches, where a batch is a numpy array (or torch tensor)
with the batch on axis 0, or a tuple/list/dict of them (features, labels, ...).

The group can change under an iterator: after a lost worker, MultiWorkerMirroredStrategy
re-forms it in the same processes (strategies/fault_tolerance.py) with another number of
workers and another index for this one. Iterators follow it: a distributed dataset splits each
next global batch over the replicas of the group as it is then, and pipelines made by a dataset
function are made again for the new InputContext (from their beginning: where the old ones
were has no meaning in the new sharding; logged).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import _nest, _tensors
from .values import PerReplica, regroup

logger = logging.getLogger("pycollective.strategies")


class InputReplicationMode(enum.Enum):
    """Replication mode for input function.

    ``PER_WORKER``: the input function is called once per worker, creating as many input
    pipelines as workers; each yields per-replica batches that go to the worker's replicas in
    turn. ``PER_REPLICA``: the input function is called once per replica.
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputOptions:
    """Run options for ``experimental_distribute_dataset(s_from_function)``.

    Only ``experimental_replication_mode`` changes anything on CPU replicas; the other fields
    are accepted for compatibility (there is no device to prefetch to).
    """

    def __init__(
        self,
        experimental_fetch_to_device: bool | None = None,
        experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER,
        experimental_place_dataset_on_device: bool = False,
        experimental_per_replica_buffer_size: int = 1,
    ) -> None:
        if not isinstance(experimental_replication_mode, InputReplicationMode):
            raise TypeError("experimental_replication_mode must be an InputReplicationMode")
        self.experimental_fetch_to_device = experimental_fetch_to_device
        self.experimental_replication_mode = experimental_replication_mode
        self.experimental_place_dataset_on_device = experimental_place_dataset_on_device
        self.experimental_per_replica_buffer_size = experimental_per_replica_buffer_size


class InputContext:
    """A class wrapping information needed by an input function.

    Args:
        num_input_pipelines: how many input pipelines there are (workers, or replicas in
            PER_REPLICA mode).
        input_pipeline_id: this pipeline's id in ``[0, num_input_pipelines)``.
        num_replicas_in_sync: replicas taking part in synchronous training.
    """

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        """Returns the number of input pipelines."""
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """Returns the input pipeline ID."""
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """Returns the number of compute replicas in sync."""
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """Returns the per-replica batch size; ``global_batch_size`` must divide evenly."""
        if global_batch_size % self._num_replicas_in_sync != 0:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size} is not divisible by "
                f"`num_replicas_in_sync` {self._num_replicas_in_sync}"
            )
        return global_batch_size // self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_input_pipelines}, "
            f"input_pipeline_id={self._input_pipeline_id}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )


class ValueContext:
    """A class wrapping information needed by a distribute function
    (``experimental_distribute_values_from_function``)."""

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._replica_id_in_sync_group = replica_id_in_sync_group
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica_id_in_sync_group

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self._replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )


def _batch_len(x: Any, where: str) -> int:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(
            f"{where}: a dataset element must be an array with the batch on axis "
            f"0 (or a tuple/dict of them), got {type(x).__name__} with shape "
            f"{shape}"
        )
    return int(shape[0])


def split_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each part of a batch of ``total`` rows split ``parts`` ways: the
    first ``total % parts`` parts get one extra row (np.array_split's rule); parts may be
    empty when ``total < parts``."""
    base, extra = divmod(total, parts)
    bounds = []
    start = 0
    for p in range(parts):
        stop = start + base + (1 if p < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


class DistributedIterator:
    """An iterator over a DistributedDataset: each ``next()`` is one step's input, with
    PerReplica leaves (plain values when there is one replica)."""

    def __init__(self, next_fn: Callable[[], Any]) -> None:
        self._next_fn = next_fn

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        return self._next_fn()

    def get_next(self) -> Any:
        """Returns the next input; raises StopIteration at the end."""
        return self._next_fn()


class DistributedDataset:
    """A dataset of global batches, each split across all replicas in sync along axis 0.

    Global replica ``g`` gets rows ``split_bounds(B, N)[g]`` of a global batch of ``B`` rows; a
    worker keeps its replicas' parts. An uneven final batch gives some replicas one row fewer
    (or none: an empty batch with the same trailing shape), so the concatenation of all
    replicas' parts is always exactly the global batch.
    """

    def __init__(self, strategy: Any, dataset: Iterable[Any]) -> None:
        if not hasattr(dataset, "__iter__"):
            raise TypeError(
                f"experimental_distribute_dataset expects an iterable of batches, "
                f"got {type(dataset).__name__}"
            )
        self._strategy = strategy
        self._dataset = dataset

    def __iter__(self) -> DistributedIterator:
        it = iter(self._dataset)
        extended = self._strategy.extended

        def next_fn() -> Any:
            # The group as it is now: a re-formed one splits the batch its own way.
            n_sync = extended._num_replicas_in_sync
            first = extended._first_replica_id
            n_local = extended._num_local_replicas
            element = next(it)
            leaves = _nest.flatten(element)
            if not leaves:
                raise ValueError("a dataset element has no arrays")
            lengths = {_batch_len(x, "experimental_distribute_dataset") for x in leaves}
            if len(lengths) != 1:
                raise ValueError(
                    f"the arrays of one dataset element have different batch sizes "
                    f"{sorted(lengths)}; they must agree on axis 0"
                )
            bounds = split_bounds(lengths.pop(), n_sync)[first : first + n_local]
            per_replica = [
                _nest.map_structure(lambda x, b=b: _as_batch(x)[b[0] : b[1]], element)
                for b in bounds
            ]
            return regroup(per_replica)

        return DistributedIterator(next_fn)


class DistributedDatasetsFromFunction:
    """Datasets made by ``dataset_fn(InputContext)``.

    PER_WORKER (default): ``dataset_fn`` is called once on this worker and yields per-replica
    batches; each step takes the next element for each local replica in turn. When the
    pipeline ends in the middle of a step, the remaining replicas get empty batches (zero rows,
    same trailing shape). PER_REPLICA: ``dataset_fn`` is called once per local replica.
    """

    def __init__(
        self,
        strategy: Any,
        dataset_fn: Callable[[InputContext], Iterable[Any]],
        options: InputOptions | None,
    ) -> None:
        if not callable(dataset_fn):
            raise TypeError(
                "distribute_datasets_from_function expects a function "
                "dataset_fn(input_context) -> iterable of batches"
            )
        self._extended = strategy.extended
        self._dataset_fn = dataset_fn
        self._mode = (
            options.experimental_replication_mode
            if options is not None
            else InputReplicationMode.PER_WORKER
        )
        self._made_for = self._layout()
        self._datasets = self._make()

    def _layout(self) -> tuple[int, int]:
        """(workers, this worker's index): what the InputContexts depend on."""
        return self._extended._num_workers, self._extended._worker_index

    def _make(self) -> list[Iterable[Any]]:
        """The pipelines: one per worker, or one per local replica (PER_REPLICA)."""
        extended = self._extended
        n_sync = extended._num_replicas_in_sync
        if self._mode == InputReplicationMode.PER_REPLICA:
            first = extended._first_replica_id
            contexts = [
                InputContext(n_sync, first + r, n_sync) for r in range(extended._num_local_replicas)
            ]
        else:
            contexts = [InputContext(extended._num_workers, extended._worker_index, n_sync)]
        datasets = [self._dataset_fn(ctx) for ctx in contexts]
        for d in datasets:
            if not hasattr(d, "__iter__"):
                raise TypeError(
                    f"dataset_fn must return an iterable of batches, got {type(d).__name__}"
                )
        return datasets

    def _follow_the_group(self) -> None:
        """Makes the pipelines again when the group re-formed since they were made."""
        if self._layout() == self._made_for:
            return
        workers, index = self._layout()
        logger.warning(
            "the group re-formed (worker %d of %d, was %d of %d): distributed input from a "
            "dataset function is made again for it, from the pipelines' beginning",
            index,
            workers,
            self._made_for[1],
            self._made_for[0],
        )
        self._made_for = self._layout()
        self._datasets = self._make()

    def __iter__(self) -> DistributedIterator:
        self._follow_the_group()
        mine = {"made_for": self._made_for, "its": [iter(d) for d in self._datasets]}

        def current() -> list[Any]:
            self._follow_the_group()
            if mine["made_for"] != self._made_for:  # pipelines of a group that is gone
                mine["made_for"] = self._made_for
                mine["its"] = [iter(d) for d in self._datasets]
            return mine["its"]

        if self._mode == InputReplicationMode.PER_REPLICA:

            def next_fn() -> Any:
                return regroup([next(i) for i in current()])
        else:

            def next_fn() -> Any:
                it = current()[0]
                elements = []
                for _ in range(self._extended._num_local_replicas):
                    try:
                        elements.append(next(it))
                    except StopIteration:
                        if not elements:
                            raise
                        elements.append(
                            _nest.map_structure(lambda x: _as_batch(x)[0:0], elements[0])
                        )
                return regroup(elements)

        return DistributedIterator(next_fn)


def _as_batch(x: Any) -> Any:
    if isinstance(x, np.ndarray) or _tensors.is_torch(x):
        return x
    return np.asarray(x)


def distribute_values(strategy: Any, value_fn: Callable[[ValueContext], Any]) -> PerReplica:
    extended = strategy.extended
    n_sync = strategy.num_replicas_in_sync
    values = [
        value_fn(ValueContext(extended._first_replica_id + r, n_sync))
        for r in range(extended._num_local_replicas)
    ]
    return regroup(values, always_wrap=True)
