"""MirroredStrategy: synchronous training across CPU replicas of one process."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from pycollective import config as _config

from .backend import LocalBackend
from .cross_device_ops import AlgorithmAllReduce, CrossDeviceOps, parse_device
from .strategy import Strategy, StrategyExtended

logger = logging.getLogger("pycollective.strategies")


def canonical_cpu_device(index: int, job: str = "localhost", task: int = 0) -> str:
    return f"/job:{job}/replica:0/task:{task}/device:CPU:{index}"


def default_cpu_replicas() -> int:
    """PYCOLLECTIVE_CPU_REPLICAS, else the number of CPU cores."""
    _config.reload()  # a strategy's start-up: the variables as they are now
    n = _config.env_int("PYCOLLECTIVE_CPU_REPLICAS", 0)
    if n < 0:
        raise ValueError(f"PYCOLLECTIVE_CPU_REPLICAS must be a positive integer, got {n}")
    return n or (os.cpu_count() or 1)


def resolve_devices(devices: Sequence[str] | None) -> tuple[str, ...]:
    """Canonical CPU device names for MirroredStrategy's ``devices`` argument."""
    if devices is None:
        return tuple(canonical_cpu_device(i) for i in range(default_cpu_replicas()))
    if isinstance(devices, str):
        raise TypeError(
            "devices must be a list of device strings, e.g. ['/cpu:0', '/cpu:1'], "
            f"not a single string {devices!r}"
        )
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one device, e.g. ['/cpu:0']")
    indices = [parse_device(d)[1] for d in devices]
    if len(set(indices)) != len(indices):
        raise ValueError(f"devices {devices} name the same device more than once")
    return tuple(canonical_cpu_device(i) for i in indices)


class MirroredExtended(StrategyExtended):
    """Implementation of MirroredStrategy (its ``extended``)."""


class MirroredStrategy(Strategy):
    """Synchronous training across multiple replicas on one machine.

    Each replica is a thread of this process with its own copy of every variable; the replicas
    combine their updates with pycollective collectives over in-process links
    (``pycollective.LocalCommunicator``), which run natively with the GIL released.

    Args:
        devices: a list of device strings such as ``['/cpu:0', '/cpu:1']`` (one CPU replica
            each). None: ``PYCOLLECTIVE_CPU_REPLICAS`` replicas, else one per CPU core. GPU
            devices are refused (NotImplementedError): the strategies keep their variables in
            host memory. GPUs are served by ``pycollective.nccl`` and the torch backend.
        cross_device_ops: optional, a descendant of CrossDeviceOps: which algorithm reduces
            across replicas. Default: ``AlgorithmAllReduce("auto")`` (pycollective picks by
            size).
    """

    def __init__(
        self, devices: Sequence[str] | None = None, cross_device_ops: CrossDeviceOps | None = None
    ) -> None:
        resolved = resolve_devices(devices)
        if cross_device_ops is None:
            cross_device_ops = AlgorithmAllReduce("auto")
        if not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(
                f"cross_device_ops must be a CrossDeviceOps (e.g. NcclAllReduce(), "
                f"AlgorithmAllReduce('ring')), got {type(cross_device_ops).__name__}"
            )
        backend = LocalBackend(len(resolved), cross_device_ops.algorithm)
        super().__init__(MirroredExtended(self, backend, cross_device_ops, resolved))
        logger.info(
            "MirroredStrategy: %d CPU replicas, cross-device ops %r",
            len(resolved),
            cross_device_ops,
        )
