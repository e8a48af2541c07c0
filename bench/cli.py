"""Command line of the benchmark: ``pycollective bench`` / ``python -m bench``.

Options follow nccl-tests: -b/-e/-f size sweep, -c collective, -d dtype, -o op, -n iterations,
-w warm-up. Every row's result is checked; a wrong result is shown and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import sys
import time

from .metrics import human_bytes, parse_size
from .report import plot, summary, table, write_csv, write_json

COLLECTIVES = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="pycollective bench", description=__doc__)
    p.add_argument("--mode", choices=["inproc"], default="inproc",
                   help="inproc: replicas are threads of one process (LocalCommunicator)")
    p.add_argument("-c", "--collective", choices=COLLECTIVES, default="allreduce")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-d", "--dtype", default="float32",
                   choices=["float16", "bfloat16", "float32", "float64", "int8", "uint8",
                            "int32", "int64"])
    p.add_argument("-o", "--op", default="sum", choices=["sum", "prod", "min", "max", "avg"])
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("--world", type=int, default=4, help="replicas (inproc) or ranks")
    p.add_argument("--algos", default="ring,halving_doubling,hierarchical,reduce_to_one,direct,"
                   "auto", help="comma-separated algorithms")
    p.add_argument("--inplace", action="store_true", help="in place instead of out= buffers")
    p.add_argument("--budget", type=float, default=1.5,
                   help="seconds of timing per row at most (at least 3 iterations)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--csv", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    return p


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    if minbytes <= 0 or maxbytes < minbytes or factor < 2:
        raise SystemExit("need 0 < -b <= -e and -f >= 2")
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        s *= factor
    return out


class Progress:
    """One status line on a terminal; nothing but the final table when piped."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.tty = total, 0, sys.stderr.isatty()
        self.start = time.time()

    def __call__(self, text: str) -> None:
        if text.startswith("skip"):
            return
        self.done += 1
        if self.tty:
            sys.stderr.write(f"\r[{self.done}/{self.total} {time.time() - self.start:5.1f}s] "
                             f"{text:<60}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + " " * 90 + "\r")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    import pycollective as pc

    from . import inproc

    algos = [a for a in args.algos.split(",") if a]
    unknown = set(algos) - set(pc.algorithms())
    if unknown:
        raise SystemExit(f"unknown algorithms {sorted(unknown)}; choose from {pc.algorithms()}")
    sweep = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    info = pc.build_info()
    copy_bw = pc._C.memory_bandwidth(min(args.maxbytes, 64 << 20), args.world, 3)
    ceilings = {"memory_copy_Bps": copy_bw}
    print(f"# pycollective {info['version']} bench: {args.collective}, {args.mode}, "
          f"{args.world} replicas, {args.dtype} {args.op}, {human_bytes(sweep[0])}.."
          f"{human_bytes(sweep[-1])}, kernels {info['simd']}")
    print(f"# ceiling: memory copy bandwidth with {args.world} threads "
          f"{copy_bw / 1e9:.1f} GB/s (read+write)")
    progress = Progress(len(sweep) * len(algos))
    rows = inproc.run(args.collective, sweep, args.dtype, args.op, args.world, algos,
                      args.iters, args.warmup, args.inplace, copy_bw, progress, args.budget)
    progress.close()
    table(rows, sys.stdout)
    print()
    for line in summary(rows):
        print(line)
    if args.json:
        write_json(rows, ceilings, args.json)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, ceilings, args.plot)
    return 1 if any(r.wrong for r in rows) else 0
