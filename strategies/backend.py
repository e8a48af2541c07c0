"""Collective backends: the cross-replica reduction as an object.

A backend runs collectives over *one numpy array per local replica* (a list in replica order)
and returns one result per local replica. Strategies never call ``LocalCommunicator`` or the
process group directly; they call a backend:

- :class:`LocalBackend`: every replica is a thread of this process (MirroredStrategy). One
  ``LocalCommunicator`` call per collective.
- :class:`MultiWorkerBackend`: replicas in several worker processes
  (MultiWorkerMirroredStrategy). One replica per worker: the process group's all-reduce
  (``pycollective.allreduce``). Several: the native hierarchical all-reduce over every replica
  of every worker (``pycollective.ReplicaGroup``).

On top of the three primitives (``allreduce``, ``allgather``, ``broadcast``) the base class
builds what strategies need: fused batches (many tensors, one collective per pack),
ragged gathers, MEAN for integer dtypes. ``call_counts`` counts primitive collectives by kind
("allreduce", "allgather", "broadcast", and "allreduce_update" for optimizer steps made inside
the all-reduce; tests use it to check fusion).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import pycollective as pc
from pycollective import config as _config
from pycollective import fused_update

from . import _tensors
from .reduce_util import ReduceOp

logger = logging.getLogger("pycollective.strategies")

#: ``replicated(i, grads)``: variable i's state with ``grads`` as its gradients (apply_update)
Replicated = Callable[[int, list[np.ndarray]], fused_update.ReplicatedTensor]

#: gradients at least this large are all-reduced on their own, not copied into a pack
SEND_ALONE_BYTES = 256 << 10


def default_timeout() -> float:
    """Seconds a collective (and a replicas' collective slot) may wait: PYCOLLECTIVE_TIMEOUT or
    300, as set when the strategy is created (a start-up: the variables are read again)."""
    _config.reload()
    return _config.default_timeout()


class CollectiveBackend:
    """Collectives over one array per local replica. Subclasses implement ``_allreduce``,
    ``_allgather`` and ``_broadcast``; the public methods count and serialize them."""

    #: local replicas (threads of this process)
    num_local_replicas: int = 1
    #: worker processes, and this one's index among them
    num_workers: int = 1
    worker_index: int = 0

    def __init__(self, algorithm: str, timeout: float | None) -> None:
        self.algorithm = algorithm
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self.call_counts: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._per_call = threading.local()  # call_options', per thread

    @property
    def num_replicas_in_sync(self) -> int:
        return self.num_local_replicas * self.num_workers

    @contextlib.contextmanager
    def call_options(
        self, seconds: float | None = None, algorithm: str | None = None
    ) -> Iterator[None]:
        """One call's ``CommunicationOptions`` for the collectives this thread runs inside: they
        take at most ``seconds`` instead of the backend's timeout, and run ``algorithm`` (its
        ``implementation``) instead of the backend's. None leaves either as it is."""
        before = (getattr(self._per_call, "seconds", None), getattr(self._per_call, "algo", None))
        if seconds is not None:
            self._per_call.seconds = float(seconds)
        if algorithm is not None:
            self._per_call.algo = algorithm
        try:
            yield
        finally:
            self._per_call.seconds, self._per_call.algo = before

    @property
    def call_algorithm(self) -> str:
        """The algorithm of a collective this thread runs now (call_options', else the
        backend's)."""
        algo = getattr(self._per_call, "algo", None)
        return self.algorithm if algo is None else algo

    @property
    def call_timeout_seconds(self) -> float:
        """The timeout of a collective this thread runs now (call_options', else the
        backend's)."""
        seconds = getattr(self._per_call, "seconds", None)
        return self.timeout if seconds is None else seconds

    @property
    def first_replica_id(self) -> int:
        """Global id of this worker's local replica 0."""
        return self.worker_index * self.num_local_replicas

    # Primitives ---------------------------------------------------------------------------------

    def allreduce(
        self, arrays: Sequence[np.ndarray], op: ReduceOp, owned: bool = False
    ) -> list[np.ndarray]:
        """Every local replica gets the SUM/MEAN over all replicas in sync. ``owned``: the
        arrays are temporaries of the caller, so the result may be written into them (no fresh
        result memory, whose page faults cost as much as the collective itself)."""
        self._check(arrays, "allreduce")
        with self._lock:
            self.call_counts["allreduce"] += 1
            if np.issubdtype(arrays[0].dtype, np.integer) and op == ReduceOp.MEAN:
                sums = self._allreduce(arrays, ReduceOp.SUM, owned)
                n = self.num_replicas_in_sync
                return [(s / n).astype(s.dtype) for s in sums]
            return self._allreduce(arrays, op, owned)

    def allgather(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every local replica gets all replicas' arrays stacked: ``(num_replicas_in_sync,
        *shape)``, in global replica order."""
        self._check(arrays, "allgather")
        with self._lock:
            self.call_counts["allgather"] += 1
            return self._allgather(arrays)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
        """Every local replica gets global replica ``root``'s array."""
        self._check(arrays, "broadcast")
        if not 0 <= root < self.num_replicas_in_sync:
            raise ValueError(
                f"root must be a replica id in [0, {self.num_replicas_in_sync}), got {root}"
            )
        with self._lock:
            self.call_counts["broadcast"] += 1
            return self._broadcast(arrays, root)

    def _allreduce(
        self, arrays: Sequence[np.ndarray], op: ReduceOp, owned: bool = False
    ) -> list[np.ndarray]:
        raise NotImplementedError

    def _allgather(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def _broadcast(self, arrays: Sequence[np.ndarray], root: int) -> list[np.ndarray]:
        raise NotImplementedError

    def _check(self, arrays: Sequence[np.ndarray], kind: str) -> None:
        if len(arrays) != self.num_local_replicas:
            raise ValueError(
                f"{kind}: {len(arrays)} values for {self.num_local_replicas} local replicas"
            )
        self._check_alike(arrays, kind)

    def _check_alike(self, arrays: Sequence[np.ndarray], what: str) -> None:
        """Every local replica's array has replica 0's shape and dtype."""
        first = arrays[0]
        for r, a in enumerate(arrays[1:], start=1):
            if a.dtype != first.dtype or a.shape != first.shape:
                raise ValueError(
                    f"{what}: replica {self.first_replica_id + r} passed "
                    f"{_tensors.describe(a)} but replica {self.first_replica_id} passed "
                    f"{_tensors.describe(first)}; every replica must pass the same shape and "
                    "dtype"
                )

    # Built on the primitives ---------------------------------------------------------------------

    def batch_allreduce(
        self,
        per_replica: Sequence[Sequence[Any]],
        op: ReduceOp,
        bytes_per_pack: int = 0,
        num_packs: int = 1,
    ) -> list[list[Any]]:
        """All-reduces many tensors with few collectives.

        ``per_replica[r]`` is replica r's list of tensors (the same shapes and dtypes in every
        replica). Tensors are grouped by dtype and packed, in order, into packs of at most
        ``bytes_per_pack`` bytes (a larger tensor gets a pack of its own), or, when
        ``bytes_per_pack`` is 0, into ``num_packs`` packs of similar size (``num_packs=0``:
        one collective per tensor). Each pack is concatenated into one flat buffer per
        replica, all-reduced with ONE collective, and split back. Results come back in each
        tensor's own framework (numpy or torch).
        """
        n_local = self.num_local_replicas
        if len(per_replica) != n_local:
            raise ValueError(
                f"batch_allreduce: {len(per_replica)} replicas' values for {n_local} local replicas"
            )
        count = len(per_replica[0])
        arrays = [
            [_tensors.to_numpy(t, f"tensor {i}") for i, t in enumerate(ts)] for ts in per_replica
        ]
        for r, ts in enumerate(arrays):
            if len(ts) != count:
                raise ValueError(
                    f"replica {self.first_replica_id + r} passed {len(ts)} tensors "
                    f"but replica {self.first_replica_id} passed {count}"
                )
        for i in range(count):
            self._check_alike([ts[i] for ts in arrays], f"tensor {i}")
        results: list[list[Any]] = [[None] * count for _ in range(n_local)]
        for pack in make_packs(arrays[0], bytes_per_pack, num_packs):
            if len(pack) == 1:
                i = pack[0]
                outs = self.allreduce([_tensors.contiguous(ts[i]) for ts in arrays], op)
                for r in range(n_local):
                    results[r][i] = outs[r].reshape(arrays[0][i].shape)
                continue
            flats = [np.concatenate([ts[i].reshape(-1) for i in pack]) for ts in arrays]
            outs = self.allreduce(flats, op, owned=True)
            for r in range(n_local):
                offset = 0
                for i in pack:
                    size = arrays[0][i].size
                    results[r][i] = outs[r][offset : offset + size].reshape(arrays[0][i].shape)
                    offset += size
        return [
            [_tensors.like(res, per_replica[r][i]) for i, res in enumerate(results[r])]
            for r in range(n_local)
        ]

    def apply_update(
        self,
        rule: str,
        hyper: fused_update.Hyper,
        per_replica: Sequence[Sequence[np.ndarray]],
        replicated: Replicated,
        bytes_per_pack: int,
    ) -> None:
        """One fused optimizer step (``pycollective.fused_update``) over all replicas in sync.

        ``per_replica[r]`` is local replica r's list of checked numpy gradients;
        ``replicated(i, grads)`` is variable i's state with ``grads`` as the arrays whose sum is
        its gradient (already checked by the caller). Here every replica is local: the update
        kernel sums the replicas' gradients while it applies them, and no collective runs.
        """
        for indices in _by_dtype(per_replica[0]):
            fused_update.apply(
                rule,
                hyper,
                [replicated(i, [ts[i] for ts in per_replica]) for i in indices],
                check=False,
            )

    def apply_sharded_update(
        self,
        rule: str,
        hyper: fused_update.Hyper,
        per_replica: Sequence[Sequence[np.ndarray]],
        replicated: Replicated,
    ) -> None:
        """Sharded optimizer state exists across workers only (MultiWorkerBackend)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no sharded optimizer state: it is a "
            "MultiWorkerMirroredStrategy option for several workers"
        )

    def gather(self, values: Sequence[Any], axis: int) -> list[Any]:
        """Concatenates every replica's value along ``axis`` (sizes along ``axis`` may differ
        between replicas); every local replica gets the result."""
        arrays = [
            _tensors.to_numpy(v, f"replica {self.first_replica_id + r}")
            for r, v in enumerate(values)
        ]
        ref = arrays[0]
        if ref.ndim == 0:
            raise ValueError(
                "gather needs tensors of rank >= 1 (a scalar has no axis to concatenate along)"
            )
        ax = axis if axis >= 0 else axis + ref.ndim
        if not 0 <= ax < ref.ndim:
            raise ValueError(f"axis {axis} is out of range for tensors of rank {ref.ndim}")
        for r, a in enumerate(arrays):
            other = tuple(d for k, d in enumerate(a.shape) if k != ax)
            if (
                a.ndim != ref.ndim
                or a.dtype != ref.dtype
                or other != tuple(d for k, d in enumerate(ref.shape) if k != ax)
            ):
                raise ValueError(
                    f"gather: replica {self.first_replica_id + r} passed {_tensors.describe(a)}"
                    f" but replica {self.first_replica_id} passed {_tensors.describe(ref)}; "
                    f"shapes may differ only along axis {axis}"
                )
        sizes = self.gather_sizes([a.shape[ax] for a in arrays])
        longest = max(sizes) if sizes else 0
        padded = []
        for a in arrays:
            if a.shape[ax] < longest:
                pad = [(0, 0)] * a.ndim
                pad[ax] = (0, longest - a.shape[ax])
                a = np.pad(a, pad)
            padded.append(_tensors.contiguous(a))
        stacked = self.allgather(padded)[0]  # (N, ..., longest, ...)
        parts = [np.take(stacked[r], np.arange(sizes[r]), axis=ax) for r in range(len(sizes))]
        out = np.concatenate(parts, axis=ax)
        return [_tensors.like(out if r == 0 else out.copy(), values[r]) for r in range(len(values))]

    def gather_sizes(self, local_sizes: Sequence[int]) -> list[int]:
        """Every replica's size (global replica order) from this worker's local sizes."""
        if self.num_workers == 1:
            return [int(s) for s in local_sizes]
        stacked = self.allgather([np.asarray([s], dtype=np.int64) for s in local_sizes])[0]
        return [int(s) for s in stacked.reshape(-1)]

    def all_equal(self, arrays: Sequence[np.ndarray]) -> tuple[int, int] | None:
        """None when every replica's array is equal, else a pair of global replica ids that
        differ."""
        if self.num_workers == 1:
            for r, a in enumerate(arrays[1:], start=1):
                if not np.array_equal(a, arrays[0]):
                    return (0, r)
            return None
        stacked = self.allgather([_tensors.contiguous(a) for a in arrays])[0]
        for r in range(1, stacked.shape[0]):
            if not np.array_equal(stacked[r], stacked[0]):
                return (0, r)
        return None


def _by_dtype(arrays: Sequence[np.ndarray]) -> list[list[int]]:
    """Indices of ``arrays`` grouped by dtype, in order."""
    groups: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(i)
    return list(groups.values())


def make_packs(
    arrays: Sequence[np.ndarray], bytes_per_pack: int = 0, num_packs: int = 1
) -> list[list[int]]:
    """Indices of ``arrays`` grouped into packs (see ``batch_allreduce``); every pack holds one
    dtype and keeps the original order."""
    if bytes_per_pack < 0 or num_packs < 0:
        raise ValueError("bytes_per_pack and num_packs must be non-negative")
    packs: list[list[int]] = []
    for indices in _by_dtype(arrays):
        if bytes_per_pack > 0:
            current: list[int] = []
            size = 0
            for i in indices:
                nbytes = arrays[i].nbytes
                if current and size + nbytes > bytes_per_pack:
                    packs.append(current)
                    current, size = [], 0
                current.append(i)
                size += nbytes
            if current:
                packs.append(current)
        elif num_packs == 0:
            packs.extend([i] for i in indices)
        elif num_packs == 1 or len(indices) == 1:
            packs.append(list(indices))
        else:
            # Split into num_packs contiguous groups of about equal bytes.
            target = sum(arrays[i].nbytes for i in indices) / num_packs
            groups: list[list[int]] = []
            current, size = [], 0
            for i in indices:
                current.append(i)
                size += arrays[i].nbytes
                if size >= target * (len(groups) + 1) and len(groups) < num_packs - 1:
                    groups.append(current)
                    current = []
            if current:
                groups.append(current)
            packs.extend(groups)
    return packs


class LocalBackend(CollectiveBackend):
    """All replicas are threads of this process: one ``pycollective.LocalCommunicator``.

    Args:
        num_replicas: local replicas.
        algorithm: any name from ``pycollective.algorithms()``.
        timeout: seconds per collective (default ``PYCOLLECTIVE_TIMEOUT``).

    After a failed collective the communicator is aborted; the next call builds a new one.
    """

    def __init__(
        self, num_replicas: int, algorithm: str = "auto", timeout: float | None = None
    ) -> None:
        super().__init__(algorithm, timeout)
        self.num_local_replicas = num_replicas
        self._comm: pc.LocalCommunicator | None = None

    def __repr__(self) -> str:
        return f"LocalBackend({self.num_local_replicas}, algorithm={self.algorithm!r})"

    @property
    def communicator(self) -> pc.LocalCommunicator:
        if self._comm is None:
            self._comm = pc.LocalCommunicator(self.num_local_replicas, timeout=self.timeout)
        return self._comm

    def _call(self, method: str, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        try:
            return getattr(self.communicator, method)(
                *args, timeout=self.call_timeout_seconds, **kwargs
            )
        except pc.CollectiveError:
            self._comm = None  # aborted: rebuild on the next call
            raise

    def _allreduce(
        self, arrays: Sequence[np.ndarray], op: ReduceOp, owned: bool = False
    ) -> list[np.ndarray]:
        if self.num_local_replicas == 1:
            return [arrays[0] if owned else np.array(arrays[0], copy=True)]
        native = "avg" if op == ReduceOp.MEAN else "sum"
        return self._call(
            "allreduce", list(arrays), op=native, algo=self.call_algorithm, inplace=owned
        )

    def _allgather(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.num_local_replicas == 1:
            return [np.array(arrays[0], copy=True)[None]]
        return self._call("allgather", list(arrays), algo=self.call_algorithm)

    def _broadcast(self, arrays: Sequence[np.ndarray], root: int) -> list[np.ndarray]:
        if self.num_local_replicas == 1:
            return [np.array(arrays[0], copy=True)]
        return self._call("broadcast", list(arrays), root=root, algo=self.call_algorithm)


class MultiWorkerBackend(CollectiveBackend):
    """Replicas in several worker processes. Global replica id = ``worker_index *
    num_local_replicas + local id``.

    All-reduce: with one replica per worker, the process group's (``pycollective.allreduce``,
    the strategy's algorithm); with several, the native hierarchical all-reduce over every
    replica of every worker (``pycollective.ReplicaGroup``, made at the first all-reduce:
    reduce-scatter among a worker's replicas, one ring per local index across workers, allgather
    among a worker's replicas).

    Gathers and broadcasts are rare (metrics, initial values) and run in three steps: local,
    across workers (the process group), local.

    ``compress`` ("bf16"/"fp16"): float32 all-reduces send 16-bit values between workers;
    ``error_feedback`` carries each optimizer bucket's rounding residue into the next step
    (``pycollective.ErrorFeedback``; one local replica per worker).
    """

    def __init__(
        self,
        num_local_replicas: int,
        algorithm: str = "auto",
        timeout: float | None = None,
        worker_index: int | None = None,
        num_workers: int | None = None,
        compress: str | None = None,
        error_feedback: bool = False,
    ) -> None:
        super().__init__(algorithm, timeout)
        self.num_local_replicas = num_local_replicas
        self.worker_index = pc.rank() if worker_index is None else worker_index
        self.num_workers = pc.world_size() if num_workers is None else num_workers
        self._local = LocalBackend(num_local_replicas, algorithm, timeout)
        self._algorithms = set(pc.algorithms())
        self._timeout_kw = _accepts_timeout()
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._replica_group: pc.ReplicaGroup | None = None
        if error_feedback and num_local_replicas > 1:
            raise ValueError(
                "error_feedback needs one replica per worker: what crosses the network is the "
                "sum of a worker's replicas, whose rounding no replica sees. Set "
                "PYCOLLECTIVE_CPU_REPLICAS=1, or drop error_feedback"
            )
        self.compress = compress
        self._feedback = pc.ErrorFeedback(compress) if error_feedback and compress else None

    def __repr__(self) -> str:
        return (
            f"MultiWorkerBackend(worker {self.worker_index}/{self.num_workers}, "
            f"{self.num_local_replicas} local replicas, algorithm={self.algorithm!r})"
        )

    def _kw(self, gradients: np.dtype | None = None) -> dict[str, Any]:
        """Keywords of the cross-worker calls. ``gradients``: the dtype of an optimizer's
        gradient bucket, which travels compressed when it is float32 and ``compress`` is set;
        nothing else does (metrics, variable reads and assignments keep float32 precision)."""
        kw: dict[str, Any] = {"timeout": self.call_timeout_seconds} if self._timeout_kw else {}
        if self.compress is not None and gradients == np.float32:
            kw["compress"] = self.compress
        return kw

    @contextlib.contextmanager
    def call_options(
        self, seconds: float | None = None, algorithm: str | None = None
    ) -> Iterator[None]:
        # The local steps (gathers, broadcasts) run on this worker's LocalBackend.
        with (
            super().call_options(seconds, algorithm),
            self._local.call_options(seconds, algorithm),
        ):
            yield

    @property
    def _cross_algo(self) -> str:
        """The algorithm of this call's collectives across workers (one replica each)."""
        algo = self.call_algorithm
        return algo if algo in self._algorithms else "auto"

    def _local_broadcast(self, buf: np.ndarray) -> list[np.ndarray]:
        if self.num_local_replicas == 1:
            return [buf]
        others = [np.empty_like(buf) for _ in range(self.num_local_replicas - 1)]
        return self._local._call("broadcast", [buf] + others, root=0, algo=self.call_algorithm)

    @property
    def replica_group(self) -> pc.ReplicaGroup:
        """Every replica of every worker as one native group (made on first use: every worker
        reaches its first all-reduce at the same point)."""
        if self._replica_group is None:
            self._replica_group = pc.ReplicaGroup(self.num_local_replicas, timeout=self.timeout)
        return self._replica_group

    def _allreduce(
        self, arrays: Sequence[np.ndarray], op: ReduceOp, owned: bool = False
    ) -> list[np.ndarray]:
        native = "avg" if op == ReduceOp.MEAN else "sum"
        if self.num_local_replicas > 1:
            return self.replica_group.allreduce(
                list(arrays), op=native, inplace=owned, timeout=self.call_timeout_seconds
            )
        x = _tensors.contiguous(arrays[0])
        out = pc.allreduce(x, op=native, algo=self._cross_algo, inplace=owned, **self._kw())
        return [_tensors.to_numpy(out)]

    def apply_update(
        self,
        rule: str,
        hyper: fused_update.Hyper,
        per_replica: Sequence[Sequence[np.ndarray]],
        replicated: Replicated,
        bytes_per_pack: int,
    ) -> None:
        """Across workers. Tensors of at least ``SEND_ALONE_BYTES`` go on their own (no copy
        into a pack: for them the copy costs more than a collective's fixed cost); smaller ones
        are concatenated into packs of ``bytes_per_pack`` bytes.

        - A rule without slots (plain SGD) runs inside the all-reduce
          (``fused_update.allreduce_apply``, when the cross-worker algorithm is "auto" or
          "ring"): each worker updates the chunk whose sum it owns and the ring carries the new
          variable where it would carry the summed gradient.
        - A rule with slots (momentum, Adam) would have the ring carry every slot as well,
          which costs more than every worker updating them in place: its tensors are
          all-reduced into a reused scratch buffer, which the update kernel then reads.

        (Overlapping the next pack's all-reduce with this pack's update was measured slower on
        a 2-core machine: the collective's waiting thread and the update compete for the
        cores.)"""
        first = per_replica[0]
        alone = [i for i, a in enumerate(first) if a.nbytes >= SEND_ALONE_BYTES]
        small = [i for i, a in enumerate(first) if a.nbytes < SEND_ALONE_BYTES]
        # The fused collective's schedule is the ring's: it stands in for "ring" and "auto",
        # not for an algorithm the user named instead. It sends state, not gradients: never
        # compressed.
        fusable = self._cross_algo in ("auto", "ring") and self.compress is None
        if not fused_update.RULES[rule][1] and fusable:
            for group in _by_dtype([first[i] for i in alone]):
                self._allreduce_apply(
                    rule, hyper, per_replica, replicated, [alone[j] for j in group]
                )
            alone = []
        packs = [[i] for i in alone] + [
            [small[j] for j in pack]
            for pack in make_packs([first[i] for i in small], bytes_per_pack)
        ]
        for pack in packs:
            buf = self._scratch_for(first[pack[0]].dtype, sum(first[i].size for i in pack))
            # The bucket's error-feedback residue is keyed by its variables (replica 0's
            # arrays, the same objects every step), never by position in this call's list.
            key = tuple(id(replicated(i, []).copies[0]) for i in pack)
            self._sum_into(buf, [[ts[i] for i in pack] for ts in per_replica], key=key)
            tensors, offset = [], 0
            for i in pack:
                view = buf[offset : offset + first[i].size].reshape(first[i].shape)
                tensors.append(replicated(i, [view]))
                offset += first[i].size
            fused_update.apply(rule, hyper, tensors, check=False)

    def apply_sharded_update(
        self,
        rule: str,
        hyper: fused_update.Hyper,
        per_replica: Sequence[Sequence[np.ndarray]],
        replicated: Replicated,
    ) -> None:
        """One optimizer step with sharded optimizer state (ZeRO stage 1): ``replicated(i,
        grads)`` gives variable i's copies and, for every slot, this worker's shard of it
        (``fused_update.shard_bounds``). The tensors of a dtype, small or large, are one
        collective (``fused_update.allreduce_apply(..., sharded_slots=True)``, one pipelined
        ring): it reduce-scatters each gradient, this worker applies the rule to its chunk as
        the sum arrives, and the ring allgathers the new variable. A tensor's chunks are its
        own (not a pack's), so which worker owns an element does not depend on which tensors a
        step updates, and nothing is copied into a pack.

        With several local replicas, their gradients are summed into scratch first and every
        local copy of the variable gets the new value; the slot shard is the worker's, one for
        all its replicas."""
        first = per_replica[0]
        for group in _by_dtype(first):
            self._allreduce_apply(rule, hyper, per_replica, replicated, group, sharded_slots=True)

    def _allreduce_apply(
        self,
        rule: str,
        hyper: fused_update.Hyper,
        per_replica: Sequence[Sequence[np.ndarray]],
        replicated: Replicated,
        indices: list[int],
        sharded_slots: bool = False,
    ) -> None:
        """Tensors ``indices`` (one dtype) through ``fused_update.allreduce_apply``, in one
        native call; with several local replicas, their sums are made in scratch first."""
        first = per_replica[0]
        with self._lock:
            self.call_counts["allreduce_update"] += len(indices)
            grads = [first[i] for i in indices]
            if len(per_replica) > 1:
                buf = self._scratch_for(
                    first[indices[0]].dtype, sum(first[i].size for i in indices)
                )
                grads, offset = [], 0
                for i in indices:
                    part = buf[offset : offset + first[i].size]
                    self._local_sum_into(part, [[ts[i]] for ts in per_replica])
                    grads.append(part.reshape(first[i].shape))
                    offset += first[i].size
            fused_update.allreduce_apply(
                rule,
                hyper,
                [replicated(i, [g]) for i, g in zip(indices, grads)],
                timeout=self.timeout,
                check=False,
                sharded_slots=sharded_slots,
            )

    def _scratch_for(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A reused buffer of ``count`` elements: fresh memory would page-fault every step."""
        scratch = self._scratch.get(dtype)
        if scratch is None or scratch.size < count:
            scratch = self._scratch[dtype] = np.empty(count, dtype)
        return scratch[:count]

    def _local_sum_into(
        self, buf: np.ndarray, per_replica: Sequence[Sequence[np.ndarray]]
    ) -> np.ndarray:
        """``buf`` = the sum over this worker's replicas of the concatenated tensors. Replica 0's
        tensors are packed straight into buf and the others are reduced into it in place: no
        other copy of the pack."""
        np.concatenate([t.reshape(-1) for t in per_replica[0]], out=buf)
        if len(per_replica) > 1:
            others = [np.concatenate([t.reshape(-1) for t in ts]) for ts in per_replica[1:]]
            self._local._call(
                "reduce", [buf] + others, root=0, op="sum", algo=self.call_algorithm, inplace=True
            )
        return buf

    def _sum_into(
        self, buf: np.ndarray, per_replica: Sequence[Sequence[np.ndarray]], key: object = None
    ) -> None:
        """``buf`` = the sum over all replicas in sync of the concatenated tensors. ``key``
        names the bucket across steps (its error-feedback residue, with compression)."""
        kw = self._kw(buf.dtype)
        feedback = self._feedback if "compress" in kw and key is not None else None
        with self._lock:
            self.call_counts["allreduce"] += 1
            if self.num_local_replicas == 1 and len(per_replica[0]) == 1 and feedback is None:
                pc.allreduce(
                    per_replica[0][0].reshape(-1), op="sum", algo=self._cross_algo, out=buf, **kw
                )
                return
            np.concatenate([t.reshape(-1) for t in per_replica[0]], out=buf)
            if self.num_local_replicas == 1:
                if feedback is not None:
                    feedback.add_residue(key, buf)
                pc.allreduce(buf, op="sum", algo=self._cross_algo, inplace=True, **kw)
                return
            # Every replica's pack is summed in place; replica 0's is buf.
            others = [np.concatenate([t.reshape(-1) for t in ts]) for ts in per_replica[1:]]
            self.replica_group.allreduce(
                [buf] + others,
                op="sum",
                inplace=True,
                compress=kw.get("compress"),
                timeout=self.call_timeout_seconds,
            )

    def _allgather(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        shape = arrays[0].shape
        local = self._local._allgather(arrays)[0]  # (L, *shape)
        gathered = _tensors.to_numpy(
            pc.allgather(_tensors.contiguous(local), algo=self._cross_algo, **self._kw())
        )
        total = (self.num_replicas_in_sync,) + tuple(shape)
        if gathered.size != int(np.prod(total)):
            raise pc.InternalError(
                f"pycollective.allgather returned {gathered.shape} for "
                f"{self.num_workers} workers of {local.shape}"
            )
        return self._local_broadcast(_tensors.contiguous(gathered.reshape(total)))

    def _broadcast(self, arrays: Sequence[np.ndarray], root: int) -> list[np.ndarray]:
        root_worker, root_local = divmod(root, self.num_local_replicas)
        buf = np.array(
            arrays[root_local] if self.worker_index == root_worker else arrays[0], copy=True
        )
        out = pc.broadcast(buf, root=root_worker, algo=self._cross_algo, **self._kw())
        buf = _tensors.to_numpy(out) if out is not None else buf
        return self._local_broadcast(_tensors.contiguous(buf))


def _accepts_timeout() -> bool:
    fn = getattr(pc, "allreduce", None)
    if fn is None:
        return False
    try:
        return "timeout" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
