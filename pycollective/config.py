"""Every PYCOLLECTIVE_* environment variable, in one table (mirrors csrc/core/params.cc).

Arguments beat the environment; the environment beats the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    doc: str


KNOBS = [
    Knob(
        "PYCOLLECTIVE_TIMEOUT", "300", "Seconds a collective may take before it fails (timeout=)."
    ),
    Knob("PYCOLLECTIVE_SEGMENT_BYTES", "262144", "Pipeline segment of ring/chain algorithms."),
    Knob("PYCOLLECTIVE_DEBUG", "WARN", "WARN, INFO (algorithm choices, links) or TRACE."),
    Knob("PYCOLLECTIVE_SIMD", "", "Force the CPU kernel set: generic, avx2 or avx512."),
    Knob("PYCOLLECTIVE_REDUCE_THREADS", "0", "Threads one large reduction may use (0 = auto)."),
    Knob("PYCOLLECTIVE_CPU_REPLICAS", "", "CPU replicas of MirroredStrategy (default: cores)."),
    Knob(
        "PYCOLLECTIVE_HIERARCHICAL_GROUP_SIZE", "", "Replicas per group of in-process hierarchical."
    ),
    Knob("PYCOLLECTIVE_TRANSPORT", "", "Force the transport between processes: shm, tcp or grpc."),
    Knob("PYCOLLECTIVE_IFNAME", "", "Network interface (or address) TCP links bind to."),
    Knob("PYCOLLECTIVE_TOKEN", "", "Cluster token every control and data connection must carry."),
    Knob("PYCOLLECTIVE_HOST_ID", "", "Overrides the host identity (tests fake several hosts)."),
    Knob("PYCOLLECTIVE_TUNING", "", "Cost-model table written by `pycollective tune`."),
    Knob(
        "PYCOLLECTIVE_DEVICE_SEGMENT_BYTES",
        "16777216",
        "Pipeline segment of ring/chain algorithms on device buffers (each step is a kernel).",
    ),
    Knob(
        "PYCOLLECTIVE_NCCL_LIBRARY",
        "",
        "libnccl.so.2 (a file, or a folder holding it) to load instead of searching the "
        "nvidia-nccl-cu* wheels and the system loader.",
    ),
    Knob(
        "PYCOLLECTIVE_PACKAGE_DIR",
        "",
        "Set by pycollective for the processes it starts (ranks, workers, ps tasks): the "
        "package they import, even where the current directory holds the source folder.",
    ),
]


def env_float(name: str, default: float) -> float:
    """Reads a float knob; a malformed value is an error that names the variable."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    """Reads an integer knob; a malformed value is an error that names the variable."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def default_timeout() -> float:
    return env_float("PYCOLLECTIVE_TIMEOUT", 300.0)
