"""Repeated timing with warm-up: median and spread of per-iteration times, of one call or of
several measured against each other."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


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


#: rounds of time_interleaved: enough that a slow phase of the machine (seconds long, on a
#: shared VM) falls on every call alike, few enough that each round keeps several iterations
ROUNDS = 8


def settling_calls(timed_per_round: int) -> int:
    """Untimed calls a row makes in each round before its timed ones: a quarter as many.

    Why: a call right after another row's calls pays for what they left behind (cache lines
    and buffers of another algorithm or library, processes the scheduler placed for another
    pattern of waits). With 3 processes on 2 vCPUs at 1 MiB the first call after a switch of
    algorithm ran 1.2x-1.35x a settled call, and the cost faded over five to ten calls; timed,
    it weighed on every row by what came before it, most on rows of few calls a round. A loop
    that repeats one call does not pay it. Rows timed once or a few times a round (calls of
    many milliseconds) get none: they would double the run for a cost their length hides."""
    return timed_per_round // 4


def time_interleaved(
    calls: dict[str, Callable[[], object]],
    iters: int,
    warmup: int,
    budget_s: float,
    rounds: int = ROUNDS,
    before_each: Callable[[], object] | dict[str, Callable[[], object]] | None = None,
    max_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, list[float]]:
    """Per-iteration times of several calls measured against each other: ``rounds`` rounds,
    each timing every call in turn for its share of the iterations. Rows compared in a summary
    ("auto against the best algorithm") then share the machine's noise instead of each getting
    its own slice of it.

    Each call gets at most ``iters`` timed iterations and about ``budget_s`` seconds of them
    (at least one iteration per round; fewer rounds when ``iters`` is smaller than ``rounds``),
    each round's timed iterations after a few untimed ones (``settling_calls``). Across
    ranks, ``before_each`` runs before every timed iteration (a barrier; a dict gives each
    call its own, as when two libraries' calls are timed in the same processes) and
    ``max_over_ranks`` makes every rank run the same iteration counts and turns each call's
    samples into the slowest rank's."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    before = before_each if isinstance(before_each, dict) else dict.fromkeys(names, before_each)

    def timed(name: str) -> float:
        barrier = before[name]
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        calls[name]()
        return time.perf_counter() - t0

    probes = np.array([timed(name) for name in names])
    if max_over_ranks is not None:
        probes = max_over_ranks(probes)
    rounds = max(1, min(rounds, iters))  # never more than iters samples per call
    per_round = {
        name: max(1, min(iters // rounds, int(budget_s / rounds / max(probe, 1e-9))))
        for name, probe in zip(names, probes)
    }
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            for _ in range(settling_calls(per_round[name])):
                timed(name)
            samples[name].extend(timed(name) for _ in range(per_round[name]))
    if max_over_ranks is not None:
        samples = {
            name: [float(t) for t in max_over_ranks(np.array(s))] for name, s in samples.items()
        }
    return samples


@dataclass
class SecondLook:
    """A contender timed again against the row that was fastest in the first pass."""

    best: str
    contender_s: float  # medians of the second pass
    best_s: float

    def as_dict(self) -> dict:
        return {"best": self.best, "median_s": self.contender_s, "best_median_s": self.best_s}


def second_look(
    calls: dict[str, Callable[[], object]],
    samples: dict[str, list[float]],
    contender: str,
    exclude: set[str],
    iters: int,
    budget_s: float,
    before_each: Callable[[], object] | dict[str, Callable[[], object]] | None = None,
    max_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None,
) -> SecondLook | None:
    """Time ``contender`` (auto) again, head to head, against the fastest other row of the first
    pass (``samples``; rows in ``exclude`` are not candidates).

    Why: the fastest of several noisy rows is, more often than not, one that caught a quick
    stretch of the machine, so a ratio to it taken from the same samples that chose it flatters
    the winner (the winner's curse): on a shared 2-vCPU VM, rows of the very same code differed by
    1.2x-1.7x within one pass. In the second pass both sides were named before they were timed.

    Across ranks the choice is the same everywhere: with ``max_over_ranks`` every rank holds the
    same samples. None when there is no contender or nothing to set beside it."""
    others = [name for name in samples if name != contender and name not in exclude]
    if contender not in samples or not others:
        return None
    best = min(others, key=lambda name: statistics.median(samples[name]))
    pair = {contender: calls[contender], best: calls[best]}
    again = time_interleaved(
        pair, iters, 0, budget_s, before_each=before_each, max_over_ranks=max_over_ranks
    )
    return SecondLook(best, statistics.median(again[contender]), statistics.median(again[best]))
