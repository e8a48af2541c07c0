"""Bandwidth figures the nccl-tests way.

algbw = bytes / time, where bytes is the size of one rank's buffer (for allgather and
reduce_scatter: the large side). busbw = algbw x a factor per collective that makes figures of
different collectives and group sizes comparable with the link bandwidth
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
"""

from __future__ import annotations


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for `collective` on `n` ranks."""
    if n <= 1:
        return 1.0
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "allgather"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce


def algbw(nbytes: int, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else 0.0


def busbw(collective: str, n: int, nbytes: int, seconds: float) -> float:
    return algbw(nbytes, seconds) * bus_factor(collective, n)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def parse_size(text: str) -> int:
    """'4K', '64M', '1G', '4096' -> bytes (powers of two, like nccl-tests' -b/-e)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)
