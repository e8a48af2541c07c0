"""algo="auto" against measurement: for in-process worlds at small sizes, auto's choice (the
cost model's, or, where the model prices a near tie, the one its trial settled on) is timed
against every other algorithm on this machine, interleaved, and must not be far behind the
fastest.

The bound is 1.5x, not the 1.15x the benchmark aims for: this runs under pytest on a shared
machine, where a slow phase landing on one algorithm's samples moves a figure by tens of
percent, and the fastest of several rows is the one such noise flattered most (a CI run failed
at 2 x 2 MiB, 1.58x, and a sweep caught a minute in which the model's halving-doubling ran 2.2x
behind `inline` at 2 x 1 MiB, gone a minute later). So auto is timed a second time against that
fastest row alone, and fails only if it is over the bound in both passes. What it catches is a
model that picks an algorithm several times slower (the kind of trap issue #15 found: inline
over direct at 64 MiB, 8x), which shows in every pass. Times are the minimum over interleaved
rounds, which a slow phase can only raise. At 256 KiB inline's one copy used to run 3-4x slower
in some runs (glibc's memcpy where the destination sat a few bytes above the source modulo the
page, core/host_copy.h), so that a bound there failed or passed by where numpy's arrays landed;
the copy avoids that case now, and the size is checked.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pycollective as pc

BOUND = 1.5
SIZES = [8, 512, 4096, 65536, 262144, 2 << 20]


def _fastest_seconds(calls: dict, rounds: int = 8, per_round: int = 10) -> dict[str, float]:
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(per_round):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / per_round)
    return best


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_auto_is_near_the_fastest_algorithm_at_small_sizes(world):
    comm = pc.LocalCommunicator(world)
    algos = [a for a in pc.algorithms() if a not in ("auto", "hierarchical", "slots", "staged")]
    report = []
    for nbytes in SIZES:
        xs = [np.full(nbytes // 4, float(r), np.float32) for r in range(world)]
        outs = [np.empty_like(x) for x in xs]
        calls = {a: (lambda a=a: comm.allreduce(xs, algo=a, out=outs)) for a in algos}
        calls["auto"] = lambda: comm.allreduce(xs, out=outs)
        for _ in range(comm.auto_trial_calls):  # auto's trial, if it measures: it settles
            calls["auto"]()
        for call in calls.values():  # warm up, and every algorithm is right
            call()
            assert all(np.all(o == world * (world - 1) / 2) for o in outs)
        chose = comm.explain("allreduce", nbytes)
        best = _fastest_seconds(calls)
        fastest = min(algos, key=best.get)
        again = _fastest_seconds({"auto": calls["auto"], fastest: calls[fastest]})
        ratio, again_ratio = best["auto"] / best[fastest], again["auto"] / again[fastest]
        report.append(
            f"{nbytes} B: auto {ratio:.2f}x the fastest ({fastest}), {again_ratio:.2f}x "
            f"again head to head; auto: {chose}"
        )
        assert min(ratio, again_ratio) <= BOUND, "\n".join(report)
