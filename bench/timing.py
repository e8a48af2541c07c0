"""Repeated timing with warm-up: median and spread of per-iteration times."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Timing:
    median: float
    p10: float
    p90: float
    iters: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the figure is."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0


def quantile(sorted_values: list[float], q: float) -> float:
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]


def summarize(samples: list[float]) -> Timing:
    s = sorted(samples)
    return Timing(statistics.median(s), quantile(s, 0.1), quantile(s, 0.9), len(s))


def time_calls(fn: Callable[[], object], iters: int, warmup: int,
               budget_s: float | None = None) -> Timing:
    """Times `fn` `iters` times after `warmup` calls; stops early (keeping at least 3 samples)
    once `budget_s` seconds of measuring are spent, so huge sizes do not stall a sweep."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if budget_s is not None and len(samples) >= 3 and time.perf_counter() - start > budget_s:
            break
    return summarize(samples)
