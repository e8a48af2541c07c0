"""algo="auto" against measurement: for in-process worlds at small sizes, auto's settled choice
(after its trial of the model's candidates, pycollective/local.py) and the model's own pick are
timed against every other algorithm on this machine, interleaved. auto must not be far behind
the fastest; the model, which only proposes the candidates now, must not be several times
behind.

The bound is 1.5x, not the 1.15x the benchmark aims for: this runs under pytest on a shared
machine, where a slow phase landing on one algorithm's samples moves a figure by tens of
percent. What it catches is a model that picks an algorithm several times slower (the kind of
trap issue #15 found: inline over direct at 64 MiB, 8x). Times are the minimum over
interleaved rounds, which a slow phase can only raise. At 256 KiB inline's one copy used to run
3-4x slower in some runs (glibc's memcpy where the destination sat a few bytes above the source
modulo the page, core/host_copy.h), so that a bound there failed or passed by where numpy's
arrays landed; the copy avoids that case now, and the size is checked.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pycollective as pc

BOUND = 1.5
#: the model's pick may be this far behind: it only proposes the candidates now, and on a shared
#: VM a slow minute has put its pick 2.2x behind the fastest (2 replicas x 1 MiB, halving-doubling
#: against inline, fifteenth session); a model off by several times (inline at 64 MiB, 8x) fails
MODEL_BOUND = 3.0
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
    algos = [a for a in pc.algorithms() if a not in ("auto", "hierarchical", "slots")]
    report = []
    for nbytes in SIZES:
        xs = [np.full(nbytes // 4, float(r), np.float32) for r in range(world)]
        outs = [np.empty_like(x) for x in xs]
        model = comm.explain("allreduce", nbytes).split()[0]  # before any call: the model's
        assert model in algos, model
        calls = {a: (lambda a=a: comm.allreduce(xs, algo=a, out=outs)) for a in algos}
        calls["auto"] = lambda: comm.allreduce(xs, out=outs)
        for _ in range(comm.auto_trial_calls):  # auto's trial: it settles on its choice
            calls["auto"]()
        for call in calls.values():  # warm up, and every algorithm is right
            call()
            assert all(np.all(o == world * (world - 1) / 2) for o in outs)
        settled = comm.explain("allreduce", nbytes)
        best = _fastest_seconds(calls)
        fastest = min(algos, key=best.get)
        ratio, model_ratio = best["auto"] / best[fastest], best[model] / best[fastest]
        report.append(
            f"{nbytes} B: auto {ratio:.2f}x the fastest ({fastest}), the model's {model} "
            f"{model_ratio:.2f}x; auto: {settled}"
        )
        assert ratio <= BOUND and model_ratio <= MODEL_BOUND, "\n".join(report)
