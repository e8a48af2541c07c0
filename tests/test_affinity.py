"""Spreading a host's ranks over its cores (pycollective/affinity.py, PYCOLLECTIVE_BIND): which
ranks are bound, to which CPU, for every thread, and that shutdown() gives the CPUs back. Each
case runs its ranks in separate processes under a hard deadline. To be independent of the
machine's core count, every rank first narrows itself to the machine's first two CPUs (as a
launcher or a cgroup would), so "as many ranks as CPUs" means two ranks. One rank on its two
CPUs stays unbound under auto: it has fewer ranks than CPUs."""

from __future__ import annotations

import os
import threading

import pytest
from multiproc import expect_error, run_ranks

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and at least two CPUs",
)


def _all_threads_cpus() -> list[list[int]]:
    """The CPUs of every thread of this process (threads that end meanwhile left out)."""
    cpus = []
    for tid in os.listdir("/proc/self/task"):
        try:
            cpus.append(sorted(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return cpus


def _bind_case(rank, n):
    two = set(sorted(os.sched_getaffinity(0))[:2])
    os.sched_setaffinity(0, two)
    import pycollective as pc

    pc.init()
    during = _all_threads_cpus()
    later: list[list[int]] = []
    t = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
    t.start()
    t.join()
    y = pc.allreduce(__import__("numpy").full(4, rank + 1.0, "float32"))
    pc.shutdown()
    return {
        "two": sorted(two),
        "during": during,
        "later": later[0],
        "after": _all_threads_cpus(),
        "sum": float(y[0]),
    }


def _expect(results, n, bound):
    for rank, res in enumerate(results):
        two = res["two"]
        want = [two[rank % 2]] if bound else two
        assert res["sum"] == n * (n + 1) / 2
        assert all(cpus == want for cpus in res["during"]), (rank, want, res["during"])
        assert res["later"] == want, (rank, "a thread started after init", res["later"])
        assert all(cpus == two for cpus in res["after"]), (rank, "after shutdown", res["after"])


# (PYCOLLECTIVE_BIND, ranks, PYCOLLECTIVE_HOST_ID, bound?) on the two CPUs every rank keeps.
CASES = [
    ("auto", 4, None, True),  # ranks outnumber the CPUs: round-robin
    ("auto", 3, None, True),  # unevenly too: halving-doubling's fold then keeps to two CPUs
    ("auto", 2, None, True),  # a CPU per rank: the scheduler sometimes keeps both on one
    ("core", 1, None, True),  # always, like mpirun --bind-to core: fewer ranks than CPUs too
    ("none", 4, None, False),
    ("auto", 1, None, False),  # fewer ranks than CPUs: an idle core stays usable
    # Pretend hosts share the machine's cores without seeing each other: auto leaves them be.
    ("auto", 4, "a", False),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting,ranks,host_id,bound", CASES)
def test_which_ranks_are_bound_and_that_shutdown_restores(setting, ranks, host_id, bound):
    env = {"PYCOLLECTIVE_BIND": setting}
    if host_id is not None:
        env["PYCOLLECTIVE_HOST_ID"] = host_id
    _expect(run_ranks(_bind_case, ranks, timeout=90, env=env), ranks, bound)


def _bad_setting(rank, n):
    import pycollective as pc

    return expect_error(pc.init)


@pytest.mark.timeout(120)
def test_a_misspelt_setting_fails_init_naming_it():
    for name, message, _ in run_ranks(
        _bad_setting, 2, timeout=90, env={"PYCOLLECTIVE_BIND": "cores"}
    ):
        assert name == "ValueError" and "PYCOLLECTIVE_BIND='cores'" in message, message
        assert "auto, core, none" in message, message
