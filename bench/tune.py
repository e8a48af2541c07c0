"""``pycollective tune``: measure this cluster, write the table algo="auto" follows.

For each transport (and for in-process replicas) it runs every algorithm over a size sweep,
keeps the winner at each size (the "choices"), and fits the alpha-beta-gamma cost model to the
ring's times so that group sizes it did not measure still get a calibrated model. Over shm it
measures 2, 3 and 4 processes (a table per process count: the winners move as ranks come to
outnumber the cores); the other transports and the cost model, the first of those. The file goes
to --output, else $PYCOLLECTIVE_TUNING; groups created afterwards with PYCOLLECTIVE_TUNING
pointing at it use it automatically.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections import defaultdict

from pycollective import config

from .metrics import human_bytes, parse_size
from .rows import Row

HELP = "measure transports and algorithms here; write the table algo='auto' uses"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output",
        default=None,
        help="file to write (default: $PYCOLLECTIVE_TUNING, else ./pycollective-tuning.json)",
    )
    p.add_argument(
        "--world",
        default=None,
        help="comma-separated process counts to measure (default: 2,3,4, the host's cores "
        "clamped to 2..4 first). The first world measures every transport and fits the cost "
        "model; the others measure shm, the transport of one host's ranks, whose best algorithm "
        "changes with the number of ranks sharing the cores",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=4,
        help="in-process replicas to tune for: the table and the fitted in-process link costs "
        "apply to LocalCommunicator/MirroredStrategy groups of this many replicas alone",
    )
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument(
        "--collectives",
        default="allreduce",
        help="comma-separated collectives to tune (allreduce, broadcast, ...)",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    # Factor 2, not 4: each entry covers sizes up to the midpoint with the next measured size,
    # and an algorithm's curve may bend in between (2 ranks over shm: `staged` won at 16 and 64
    # KiB, ran 1.24x slower than halving-doubling at 32 KiB, and `auto` followed the 16 KiB entry
    # there). The tune takes longer: 200 s against 137 here.
    p.add_argument(
        "-f",
        "--stepfactor",
        type=int,
        default=2,
        help="each measured size this many times the last",
    )
    p.add_argument("--budget", type=float, default=0.3, help="seconds of timing per row")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="sweeps per setting; the winner is the algorithm whose slowest sweep is fastest",
    )


# Timed iterations per (size, algorithm) and round, at most (the budget caps large sizes).
TUNE_ITERS = 40

# Algorithms within this fraction of the fastest count as tied: the tie goes to the previous
# size's winner, so noise does not make the table flip between equals from size to size.
TIE = 0.05

# A winner at one size alone, between two sizes won by the same other algorithm, keeps its entry
# only where that algorithm ran this much slower than it there: an algorithm's time is smooth in
# the size, a lone winner is more often the noise of three sweeps, and within this margin the
# neighbours' algorithm is no trap (issue 15 counts `auto` over 1.15x the fastest as one). Two
# tunes on 2 vCPUs wrote such entries: `hierarchical` at 2 processes x 4 MiB among
# halving-doubling (in the sweep after it 1.26x halving-doubling's time) and at 4 processes x
# 4 MiB among `staged`.
LONE_WINNER_MARGIN = 0.15


def winners(rows: list[Row], transport: str, world: int, collective: str) -> list[dict]:
    """The fastest algorithm at each measured size, judged by its slowest round: this VM has
    slow phases in which algorithms with many synchronizing steps lose 2-3x while ``direct``
    does not, so the winner of the worst case is the choice that stays good. A near tie goes to
    the previous size's winner (TIE), a lone winner to its neighbours' (LONE_WINNER_MARGIN).
    Each entry covers sizes up to the geometric midpoint with the next measured size (the last
    entry covers everything above)."""
    times: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.peer or r.algo == "auto" or r.collective != collective or r.wrong:
            continue
        times[r.nbytes][r.algo].append(r.median_s)
    sizes = sorted(times)
    worst = [{a: max(ts) for a, ts in times[s].items()} for s in sizes]
    picks: list[str] = []
    for w in worst:
        best = min(w, key=w.get)
        if picks and picks[-1] in w and w[picks[-1]] <= w[best] * (1 + TIE):
            best = picks[-1]
        picks.append(best)
    for i in range(1, len(picks) - 1):
        around = picks[i - 1]
        if around == picks[i + 1] != picks[i] and around in worst[i]:
            if worst[i][around] <= worst[i][picks[i]] * (1 + LONE_WINNER_MARGIN):
                picks[i] = around
    return [
        {
            "transport": transport,
            "world": world,
            "collective": collective,
            "max_bytes": int(math.sqrt(s * sizes[i + 1])) if i + 1 < len(sizes) else s,
            "algo": picks[i],
        }
        for i, s in enumerate(sizes)
    ]


def fit_costs(
    rows: list[Row], world: int, gamma: float, cores: int = 0
) -> tuple[float, float, float] | None:
    """alpha and beta from the ring allreduce at the smallest sizes (the fastest of those up to
    4x the smallest) and the largest, each the median of its rounds:
    t(S) = 2(n-1) alpha + 2(n-1)/n S (beta + gamma/2). With ``cores`` (the host's, for
    processes that all share it) fewer than ``world``, the model's crowding is taken out
    (csrc/algorithms/shared_cores.h): each step's wait for a parked peer, and bytes moving at
    cores / world of their speed; the model adds both back where ranks outnumber cores, and
    would otherwise count them twice."""
    from pycollective._ext import _C

    crowd = world / cores if 0 < cores < world else 1.0
    parked = _C.PARKED_PEER_SECONDS if crowd > 1 else 0.0
    # Each size's time is the median of its rounds: one round's row alone once fitted the shm
    # links' alpha at 10.0 us where other tunes fitted 2.7-3.0, and `auto` then ran 1.2x-1.4x
    # slower than the best at 3 ranks x 16 KiB (docs/benchmarks-log.md, "Issue 15's points with
    # this build"); a slow first size in every round is handled below.
    by_size: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r.algo == "ring" and r.collective == "allreduce" and not r.peer:
            by_size[r.nbytes].append(r.median_s)
    if len(by_size) < 2 or world < 2:
        return None
    seconds = {nbytes: statistics.median(ts) for nbytes, ts in by_size.items()}
    small_bytes, large_bytes = min(seconds), max(seconds)
    steps = 2 * (world - 1)
    per_byte = (seconds[large_bytes] - seconds[small_bytes]) / (
        steps / world * (large_bytes - small_bytes)
    )
    # The smallest size's time, or a little larger one's where that is less: the sweep's first
    # row paid for a start in every round of some tunes (2 ranks x 4 KiB 19-22 us against 5;
    # alpha fitted at 9.4 and 10.9 us where others gave 2.1-2.5, and `auto` ran 1.3x slower than
    # the best at 3 ranks x 16 KiB). Not brought back by the bytes' cost: that slope, fitted on
    # sizes past the cache, is steeper than in it (alpha came out at 1.0 us so).
    small_s = min(seconds[nbytes] for nbytes in seconds if nbytes <= 4 * small_bytes)
    alpha = max(1e-7, small_s / steps - parked)
    per_byte /= crowd
    beta = max(1e-12, per_byte - gamma / 2)
    return (alpha, beta, gamma)


def measure_gamma() -> float:
    """Seconds per byte of a float32 sum of two 64 MiB buffers into a third."""
    import numpy as np

    import pycollective as pc

    codes = pc._C.enum_codes()
    n = 16 << 20
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        pc._C.reduce_into(
            dst=c.ctypes.data,
            a=a.ctypes.data,
            b=b.ctypes.data,
            count=n,
            dtype=codes["dtype"]["float32"],
            op=codes["reduce_op"]["sum"],
        )
        best = min(best, time.perf_counter() - t0)
    return best / (n * 4)


# The process counts tuned by default: a host's jobs run 2-4 ranks here most often, and with
# more ranks than cores the winners move (tuned at 2 ranks only, 3 ranks x 2 MiB ran
# halving-doubling, 1.19x `staged`, in the forty-first session's sweep).
DEFAULT_WORLDS = (2, 3, 4)


def process_worlds(spec: str | None, cores: int) -> list[int]:
    """The process counts to measure, the primary (cost model, every transport) first."""
    if spec:
        try:
            worlds = [int(w) for w in spec.split(",") if w.strip()]
        except ValueError:
            worlds = []
        if not worlds or min(worlds) < 2:
            raise SystemExit(f"tune: --world takes process counts of 2 or more, not {spec!r}")
        return list(dict.fromkeys(worlds))
    primary = max(2, min(4, cores))
    return [primary] + [w for w in DEFAULT_WORLDS if w != primary]


def main(args: argparse.Namespace) -> int:
    from pycollective import tuning

    from . import inproc, procs
    from .cli import IN_PROCESS_ONLY, PROCESSES_ONLY, Progress, sizes

    out_path = args.output or config.text("PYCOLLECTIVE_TUNING") or "pycollective-tuning.json"
    worlds = process_worlds(args.world, os.cpu_count() or 2)
    sweep = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    collectives = [c for c in args.collectives.split(",") if c]
    transports = [t for t in args.transports.split(",") if t]
    gamma = measure_gamma()
    result = tuning.Tuning()
    import pycollective as pc

    for collective in collectives:
        for world, transport in [(worlds[0], t) for t in transports] + [
            (w, "shm") for w in worlds[1:] if "shm" in transports
        ]:
            algos = [a for a in pc.algorithms() if a != "auto" and a not in IN_PROCESS_ONLY]
            progress = Progress(len(sweep) * len(algos) * args.rounds)
            rows = [
                row
                for _ in range(args.rounds)
                for row in procs.run(
                    collective,
                    sweep,
                    "float32",
                    "sum",
                    world,
                    algos,
                    [transport],
                    [],
                    TUNE_ITERS,
                    2,
                    args.budget,
                    progress,
                    [],
                )
            ]
            progress.close()
            result.choices += winners(rows, transport, world, collective)
            fitted = (
                # The online CPUs, as the native hostCores() counts them (not the affinity mask).
                fit_costs(rows, world, gamma, os.cpu_count() or 0)
                if collective == "allreduce" and world == worlds[0]
                else None
            )
            if fitted:
                result.costs[transport] = fitted
            print(
                f"{transport}, {world} processes, {collective}: "
                + ", ".join(
                    f"<={human_bytes(c['max_bytes'])} {c['algo']}"
                    for c in winners(rows, transport, world, collective)
                )
            )
        algos = [a for a in pc.algorithms() if a != "auto" and a not in PROCESSES_ONLY]
        progress = Progress(len(sweep) * len(algos) * args.rounds)
        copy_bw = pc._C.memory_bandwidth(
            bytes_per_thread=min(args.maxbytes, 64 << 20), threads=args.replicas
        )
        rows = [
            row
            for _ in range(args.rounds)
            for row in inproc.run(
                collective,
                sweep,
                "float32",
                "sum",
                args.replicas,
                algos,
                TUNE_ITERS,
                2,
                False,
                copy_bw,
                progress,
                args.budget,
            )
        ]
        progress.close()
        result.choices += winners(rows, "inproc", args.replicas, collective)
        fitted = fit_costs(rows, args.replicas, gamma) if collective == "allreduce" else None
        if fitted:
            result.costs["inproc"] = fitted
        print(
            f"inproc, {args.replicas} replicas, {collective}: "
            + ", ".join(
                f"<={human_bytes(c['max_bytes'])} {c['algo']}"
                for c in winners(rows, "inproc", args.replicas, collective)
            )
        )
    tuning.save(result, out_path)
    for name, (a, b, g) in sorted(result.costs.items()):
        print(
            f"cost model {name}: alpha {a * 1e6:.1f} us, beta {1 / b / 1e9:.2f} GB/s, "
            f"gamma {1 / g / 1e9:.2f} GB/s"
        )
    print(f"wrote {out_path}; groups use it when PYCOLLECTIVE_TUNING={os.path.abspath(out_path)}")
    return 0
