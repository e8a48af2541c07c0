"""CrossDeviceOps: how MirroredStrategy reduces and broadcasts across replicas.

Each class names a pycollective algorithm; the reduction itself runs on a collective backend
(:mod:`.backend`), so every class does the same work with a different schedule:

=============================  ===================  ==========================================
class                          algorithm            notes
=============================  ===================  ==========================================
AlgorithmAllReduce(name)       ``name``             any name from ``pycollective.algorithms()``
NcclAllReduce()                ``ring`` on CPU      CPU replicas have no NCCL (logged once)
HierarchicalCopyAllReduce()    ``hierarchical``
ReductionToOneDevice()         ``reduce_to_one``
=============================  ===================  ==========================================

The default of MirroredStrategy on CPU replicas is ``AlgorithmAllReduce("auto")``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

import pycollective as pc

from . import _tensors
from ._variable_ops import VariableOps
from .backend import CollectiveBackend, LocalBackend
from .communication import CommunicationImplementation, CommunicationOptions
from .reduce_util import ReduceOp, parse_reduce_op
from .values import DistributedValues, Mirrored, PerReplica

logger = logging.getLogger("pycollective.strategies")
_logged_once: set[str] = set()
_log_lock = threading.Lock()


def log_once(key: str, message: str, level: int = logging.WARNING) -> None:
    with _log_lock:
        if key in _logged_once:
            return
        _logged_once.add(key)
    logger.log(level, message)


def host_algorithm(implementation: CommunicationImplementation) -> str | None:
    """The pycollective algorithm an implementation asks for on CPU replicas: "ring" for RING,
    and for NCCL, which CPU replicas do not have (logged once); None for AUTO (the strategy's
    own choice)."""
    if implementation == CommunicationImplementation.RING:
        return "ring"
    if implementation == CommunicationImplementation.NCCL:
        log_once(
            "nccl-implementation-cpu",
            "CommunicationImplementation.NCCL: CPU replicas have no NCCL; "
            "using pycollective's ring all-reduce instead",
        )
        return "ring"
    return None


def call_settings(options: CommunicationOptions | None) -> tuple[float | None, str | None]:
    """What one call's options (merged with the strategy's) set for its collectives
    (``CollectiveBackend.call_options``): the timeout, and the algorithm of their
    implementation (host_algorithm; None for AUTO, the strategy's own)."""
    if options is None:
        return None, None
    return options.timeout_seconds, host_algorithm(options.implementation)


class CrossDeviceOps:
    """Base class for cross-device reduction and broadcasting algorithms.

    Used standalone, ``reduce``/``batch_reduce``/``broadcast`` run on a LocalCommunicator sized
    to the values; inside a strategy they run on the strategy's backend.
    """

    #: the pycollective algorithm name this class runs
    algorithm: str = "auto"
    #: packs a batch of tensors is split into (0: one collective per tensor)
    num_packs: int = 1

    def __init__(self) -> None:
        self._standalone: dict[int, LocalBackend] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(algorithm={self.algorithm!r}, num_packs={self.num_packs})"

    # tf.distribute.CrossDeviceOps API ----------------------------------------------------------

    def reduce(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduce ``per_replica_value`` to ``destinations`` (a Mirrored value, one component
        per replica; a single device string gives a plain tensor)."""
        return self.reduce_implementation(reduce_op, per_replica_value, destinations, options)

    def batch_reduce(
        self,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduce values to destinations in batches: the values are fused into packs, one
        collective per pack."""
        return self.batch_reduce_implementation(reduce_op, value_destination_pairs, options)

    def broadcast(self, tensor: Any, destinations: Any) -> Any:
        """Broadcast ``tensor`` to ``destinations`` (a Mirrored value)."""
        return self.broadcast_implementation(tensor, destinations)

    def reduce_implementation(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any,
        options: CommunicationOptions | None,
    ) -> Any:
        backend = self._standalone_backend(per_replica_value)
        return self._batch_reduce(backend, reduce_op, [(per_replica_value, destinations)], options)[
            0
        ]

    def batch_reduce_implementation(
        self,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None,
    ) -> list[Any]:
        pairs = _check_pairs(value_destination_pairs)
        if not pairs:
            return []
        backend = self._standalone_backend(pairs[0][0])
        return self._batch_reduce(backend, reduce_op, pairs, options)

    def broadcast_implementation(self, tensor: Any, destinations: Any) -> Any:
        n = _num_destinations(destinations)
        return self._broadcast(self._backend_for(n), tensor, destinations)

    # Used by the strategies, with their backend ---------------------------------------------------

    def _batch_reduce(
        self,
        backend: CollectiveBackend,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None,
    ) -> list[Any]:
        op = parse_reduce_op(reduce_op)
        pairs = _check_pairs(value_destination_pairs)
        n_local = backend.num_local_replicas
        n_sync = backend.num_replicas_in_sync
        results: list[Any] = [None] * len(pairs)
        to_reduce: list[int] = []
        per_replica: list[list[Any]] = [[] for _ in range(n_local)]
        for k, (value, _) in enumerate(pairs):
            if not isinstance(value, DistributedValues) and n_local == 1:
                # With one local replica, a plain value is that replica's value (tf's rule
                # for multi-worker strategies): it is reduced across workers.
                value = PerReplica([value])
            if isinstance(value, DistributedValues):
                comps = value.values
                if len(comps) != n_local:
                    raise ValueError(
                        f"value {k} has {len(comps)} components but there are "
                        f"{n_local} local replicas"
                    )
                for r in range(n_local):
                    per_replica[r].append(_plain(comps[r]))
                to_reduce.append(k)
            else:
                results[k] = _reduce_non_distributed(op, value, n_sync)
        if to_reduce:
            bytes_per_pack = options.bytes_per_pack if options is not None else 0
            with backend.call_options(*call_settings(options)):
                reduced = backend.batch_allreduce(
                    per_replica, op, bytes_per_pack=bytes_per_pack, num_packs=self.num_packs
                )
            for j, k in enumerate(to_reduce):
                results[k] = [reduced[r][j] for r in range(n_local)]
        out = []
        for k, (_, dest) in enumerate(pairs):
            res = results[k]
            if not isinstance(res, list):  # non-distributed: the same value on every replica
                res = [res] + [_copy(res) for _ in range(n_local - 1)]
            out.append(_to_destinations(res, dest))
        return out

    def _broadcast(self, backend: CollectiveBackend, tensor: Any, destinations: Any) -> Any:
        arr = _tensors.contiguous(_tensors.to_numpy(_plain(tensor), "tensor"))
        outs = backend.broadcast([arr] * backend.num_local_replicas, root=0)
        return _to_destinations([_tensors.like(o, tensor) for o in outs], destinations)

    # Standalone use ----------------------------------------------------------------------------

    def _standalone_backend(self, value: Any) -> CollectiveBackend:
        n = len(value.values) if isinstance(value, DistributedValues) else 1
        return self._backend_for(n)

    def _backend_for(self, n: int) -> CollectiveBackend:
        with self._lock:
            backend = self._standalone.get(n)
            if backend is None:
                backend = self._standalone[n] = LocalBackend(n, self.algorithm)
            return backend


class AlgorithmAllReduce(CrossDeviceOps):
    """All-reduce with a named pycollective algorithm.

    Args:
        algorithm: any name from ``pycollective.algorithms()`` ("ring", "halving_doubling",
            "hierarchical", "reduce_to_one", "direct", "inline", "auto").
        num_packs: a non-negative integer: batches of tensors are fused into this many packs,
            one collective each (0: one collective per tensor).
    """

    def __init__(self, algorithm: str = "auto", num_packs: int = 1) -> None:
        super().__init__()
        names = list(pc.algorithms())
        if not isinstance(algorithm, str) or algorithm not in names:
            raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(names)}")
        self.algorithm = algorithm
        self.num_packs = _check_num_packs(num_packs)

    def __repr__(self) -> str:
        return f"AlgorithmAllReduce({self.algorithm!r}, num_packs={self.num_packs})"


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce implementation of CrossDeviceOps.

    On CPU replicas (the only kind this build runs) there is no NCCL: the reduction falls back
    to pycollective's ring all-reduce, the schedule NCCL itself uses, and a warning says so
    once per process.

    Args:
        num_packs: a non-negative integer: batches of tensors are fused into this many packs,
            one collective each (0: one collective per tensor).
    """

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__()
        self.num_packs = _check_num_packs(num_packs)
        self.algorithm = "ring"
        log_once(
            "nccl-cpu",
            "NcclAllReduce: CPU replicas have no NCCL; using pycollective's "
            "ring all-reduce instead",
        )

    def __repr__(self) -> str:
        return f"NcclAllReduce(num_packs={self.num_packs})"


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """Hierarchical all-reduce: within groups of replicas, across groups, back within groups
    (pycollective's ``hierarchical`` algorithm; the group size comes from
    ``PYCOLLECTIVE_HIERARCHICAL_GROUP_SIZE``, by default one group).

    Args:
        num_packs: a non-negative integer: batches of tensors are fused into this many packs.
    """

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__()
        self.num_packs = _check_num_packs(num_packs)
        self.algorithm = "hierarchical"

    def __repr__(self) -> str:
        return f"HierarchicalCopyAllReduce(num_packs={self.num_packs})"


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce on one replica, then broadcast the result (pycollective's ``reduce_to_one``).

    Args:
        reduce_to_device: the device to reduce on (a CPU device string, or None); the native
            algorithm reduces on replica 0, so this is validated and recorded only.
        accumulation_fn: not supported (reductions run in native kernels); must be None.
    """

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None) -> None:
        super().__init__()
        if reduce_to_device is not None:
            parse_device(reduce_to_device)
        if accumulation_fn is not None:
            raise ValueError(
                "ReductionToOneDevice(accumulation_fn=...) is not supported: the "
                "reduction runs in pycollective's native kernels"
            )
        self.reduce_to_device = reduce_to_device
        self.algorithm = "reduce_to_one"

    def __repr__(self) -> str:
        return f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r})"


# Helpers ------------------------------------------------------------------------------------------

_DEVICE_RE = re.compile(
    r"^(?:/job:[\w-]+)?(?:/replica:\d+)?(?:/task:\d+)?/?(?:device:)?([a-z_]+):(\d+)$", re.IGNORECASE
)


def parse_device(device: str) -> tuple[str, int]:
    """(kind, index) of a device string: "/cpu:0", "/device:CPU:1",
    "/job:localhost/replica:0/task:0/device:CPU:2", "cpu:3". GPU devices are refused: the
    strategies keep their variables in host memory (numpy)."""
    if not isinstance(device, str):
        raise TypeError(f"a device must be a string like '/cpu:0', got {type(device).__name__}")
    m = _DEVICE_RE.match(device.strip())
    if m is None:
        raise ValueError(
            f"cannot parse device {device!r}; expected e.g. '/cpu:0' or "
            "'/job:localhost/replica:0/task:0/device:CPU:0'"
        )
    kind, index = m.group(1).lower(), int(m.group(2))
    if kind in ("gpu", "xla_gpu"):
        raise NotImplementedError(
            f"device {device!r}: the strategies keep their variables in host memory (numpy) "
            "and have no GPU replicas; use CPU replicas (devices=['/cpu:0', '/cpu:1', ...]). "
            "For GPUs, pycollective.nccl and the torch.distributed backend run NCCL on device "
            "tensors (docs/torch.md)"
        )
    if kind not in ("cpu", "xla_cpu"):
        raise ValueError(
            f"device {device!r}: unsupported device type {kind!r}; this build runs "
            "CPU replicas ('/cpu:N')"
        )
    return "cpu", index


def _check_num_packs(num_packs: Any) -> int:
    if isinstance(num_packs, bool) or not isinstance(num_packs, int) or num_packs < 0:
        raise ValueError(f"num_packs must be a non-negative integer, got {num_packs!r}")
    return num_packs


def _check_pairs(pairs: Any) -> list[tuple[Any, Any]]:
    out = []
    for p in pairs:
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise ValueError(
                "value_destination_pairs must be a list of (value, destinations) "
                f"pairs, got an element {p!r}"
            )
        out.append((p[0], p[1]))
    return out


def _plain(x: Any) -> Any:
    """A component as a tensor: variable components and variables read as arrays."""
    return x.read_value() if isinstance(x, VariableOps) else x


def _copy(x: Any) -> Any:
    if _tensors.is_torch(x):
        return x.clone()
    return np.array(x, copy=True)


def _reduce_non_distributed(op: ReduceOp, value: Any, n_sync: int) -> Any:
    """tf's rule for a value that is not per-replica: it is the same on every replica, so MEAN
    is the value itself; SUM over more than one replica is refused (it is ambiguous)."""
    value = _plain(value)
    if op == ReduceOp.MEAN or n_sync == 1:
        return value
    raise ValueError(
        f"A non-DistributedValues value {value!r} cannot be reduced with "
        f"ReduceOp.SUM over {n_sync} replicas; pass a PerReplica value (e.g. the "
        "result of strategy.run) or use ReduceOp.MEAN"
    )


def _num_destinations(destinations: Any) -> int:
    if isinstance(destinations, DistributedValues):
        return len(destinations.values)
    if isinstance(destinations, (list, tuple)):
        return len(destinations)
    return 1


def _to_destinations(per_replica: list[Any], destinations: Any) -> Any:
    """Results as tf returns them: a Mirrored value on the replicas, or a plain tensor when the
    destination is one device string."""
    if isinstance(destinations, str):
        kind_index = parse_device(destinations)
        index = kind_index[1] if kind_index[1] < len(per_replica) else 0
        return per_replica[index]
    return Mirrored(per_replica)


__all__ = [
    "AlgorithmAllReduce",
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
]
