"""Spreading a host's ranks over its cores (``PYCOLLECTIVE_BIND``).

When a host runs more ranks than it has cores, every collective needs every rank of the host
to run, so the ranks take turns on the cores. Left to itself the scheduler sometimes keeps three
of four ranks on one of two cores for a whole run (each rank is always runnable: it computes,
or polls and yields), and then every call waits for three turns on that core instead of two.
Measured with 4 ranks on 2 cores, a prepared 8-byte all-reduce after a barrier: 3.7-5.0 us with
the ranks pinned two per core, 6.9-7.3 us with three pinned to one core; of 12 launches left to
the scheduler 7 ran at 5.9-7.9 us (docs/benchmarks-log.md, "Four ranks on two cores").

``auto`` (the default) therefore binds each rank to one core of the CPUs it may use,
round-robin by local rank, where the host's ranks are at least as many as those CPUs. With as
many ranks as cores the scheduler usually spreads them, but not always: each rank that wakes
its peer can pull the peer onto its own core, and two ranks on two cores then sometimes share
one for hundreds of calls. Measured with 2 ranks on 2 vCPUs, 200 all-reduces of 256 KiB a
launch, 20 launches alternating: unbound, 3 ran both ranks on one CPU throughout, 46.6-50.4 us
a call against 34.2-38.1 (about 230 preemptions a rank against 30-40); bound, none (34.1-37.6).
In one of six unbound benchmark runs 16 KiB and 64 KiB calls ran 4x and 2.7x slower (21.3 and
29.4 us against 4.9-5.9 and 10.9-11.2), what both ranks pinned to one core take (22.4-23.1 and
31.7-31.8); bound, those rows ran 5.3-6.7 and 10.8-11.1 us, the larger ones alike
(docs/benchmarks-log.md, "Two ranks on two cores"). With
fewer ranks than CPUs a bound rank could no longer use an idle core, and idle cores are where
the scheduler puts a woken rank. With an uneven count (3 ranks on 2 CPUs) one core holds an
extra rank either way; bound, consecutive ranks sit on different cores, so halving-doubling,
whose fold and exchange keep two ranks busy at a time, always runs them on two cores. Left to
the scheduler it sometimes ran them on one. In three alternating pairs of sweeps of 3 ranks, at
1-16 MiB halving-doubling took 0.73x-0.85x the ring's time bound and 0.76x-1.17x unbound (by
run and size), and ``auto`` was over 1.15x the fastest algorithm in 2, 5 and 2 of 24 cells
unbound, in none bound. The best time bound against the best unbound: 0.75x-1.00x at 1-16 MiB,
0.97x-1.14x at 64 MiB, and 0.89x-1.19x at 8 B-8 KiB, where the runs disagreed
(docs/benchmarks-log.md, "Three ranks on two cores").
``core`` binds in every case (as ``mpirun --bind-to core`` does), ``none`` never. The binding
covers every thread of the process at init and every thread started later, and ``shutdown()``
restores the CPUs the process had before.

A host's ranks are those that report its host id. Pretend hosts on one machine
(``PYCOLLECTIVE_HOST_ID``, network namespaces with host names of their own) share its cores
without seeing each other, so ``auto`` leaves ranks with ``PYCOLLECTIVE_HOST_ID`` set unbound.
"""

from __future__ import annotations

import logging
import os

from pycollective import config

_log = logging.getLogger(__name__)

MODES = ("auto", "core", "none")


def _threads() -> list[int]:
    """Ids of this process's threads (Linux); the calling thread alone elsewhere."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_for_all_threads(cpus: set[int]) -> None:
    # A thread inherits its creator's CPUs, so one that a not-yet-updated thread starts while
    # this runs (gRPC grows its pools on demand) would keep the old ones: list again until a
    # pass finds no thread it has not set.
    done: set[int] = set()
    for _ in range(100):
        fresh = [tid for tid in _threads() if tid not in done]
        if not fresh:
            return
        for tid in fresh:
            try:
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, FileNotFoundError):
                pass  # a thread that ended meanwhile
            done.add(tid)


def spread_over_cores(rank: int, local_rank: int, local_size: int) -> set[int] | None:
    """Binds this process to one core per ``PYCOLLECTIVE_BIND`` (see the module's docstring).
    Returns the CPUs it may use before, for :func:`restore`, or None when it left them alone."""
    mode = config.text("PYCOLLECTIVE_BIND").lower()  # the table's default: auto
    if mode not in MODES:
        raise ValueError(
            f"rank {rank}: PYCOLLECTIVE_BIND={mode!r} is not one of {', '.join(MODES)}"
        )
    if mode == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    cpus = sorted(before)
    if len(cpus) < 2:
        return None
    if mode == "auto" and (local_size < len(cpus) or config.text("PYCOLLECTIVE_HOST_ID")):
        return None
    core = cpus[local_rank % len(cpus)]
    try:
        _set_for_all_threads({core})
    except OSError as exc:  # a container or a policy may forbid it: run unbound
        _log.info("rank %d: could not bind to CPU %d (%s); running unbound", rank, core, exc)
        restore(before)  # the threads bound before the refusal
        return None
    _log.info(
        "rank %d: bound to CPU %d (local rank %d of %d on %d CPUs; PYCOLLECTIVE_BIND=%s)",
        rank,
        core,
        local_rank,
        local_size,
        len(cpus),
        mode,
    )
    return before


def restore(cpus: set[int] | None) -> None:
    """Undoes :func:`spread_over_cores` (a no-op for None)."""
    if cpus is not None:
        try:
            _set_for_all_threads(cpus)
        except OSError as exc:
            _log.info("could not restore the CPUs this process had before init (%s)", exc)
