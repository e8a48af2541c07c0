"""Compressed all-reduce (``compress="bf16"``/``"fp16"``) against the same call uncompressed,
side by side in one run, interleaved. Run it in every rank of a job whose ranks sit on several
hosts (or the multi-host namespace cluster, bench/netns_cluster.sh):

    pycollective run -n 4 --host-ids a,a,b,b python -m pycollective.bench.compress_bench
    sudo bench/netns_cluster.sh 2 2 1gbit -- "$(command -v pycollective)" bench-compress

Rank 0 prints a markdown table: median milliseconds per float32 all-reduce (the slowest rank's
time, over interleaved rounds), each compressed row's speed-up over the uncompressed row of the
same algorithm, and the worst error against the float64 sum relative to the sum of magnitudes.
"""

from __future__ import annotations

import argparse

import numpy as np

import pycollective as pc

from .timing import summarize, time_interleaved


def parse_sizes(text: str) -> list[int]:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s) for s in text.split(",")]


def rank_input(rank: int, count: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(count).astype(np.float32)


def worst_relative_error(y: np.ndarray, count: int, size: int) -> float:
    """max |y - exact sum| / sum of |x| over elements, exact in float64 (first 1M elements)."""
    n = min(count, 1 << 20)
    xs = np.stack([rank_input(r, count)[:n].astype(np.float64) for r in range(size)])
    return float((np.abs(y[:n] - xs.sum(axis=0)) / np.abs(xs).sum(axis=0)).max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,64M", help="bytes per rank, comma-separated")
    parser.add_argument("--algos", default="hierarchical,ring,auto")
    parser.add_argument("--formats", default="bf16,fp16")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per row at most")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per row at most")
    args = parser.parse_args(argv)
    pc.init()
    rank, size = pc.rank(), pc.world_size()
    formats = [None] + [f for f in args.formats.split(",") if f]
    rows = []
    for nbytes in parse_sizes(args.sizes):
        count = nbytes // 4
        x = rank_input(rank, count)
        out = np.empty_like(x)
        calls, errors = {}, {}
        for algo in args.algos.split(","):
            for fmt in formats:
                name = f"{algo} {fmt or 'float32'}"
                calls[name] = lambda a=algo, f=fmt, x=x, out=out: pc.allreduce(
                    x, algo=a, out=out, compress=f
                )
                calls[name]()
                errors[name] = worst_relative_error(out, count, size)
        samples = time_interleaved(
            calls,
            args.iters,
            warmup=1,
            budget_s=args.budget,
            rounds=min(4, args.iters),
            before_each=pc.barrier,
            max_over_ranks=lambda v: pc.allreduce(v, op="max", algo="ring"),
        )
        for name, times in samples.items():
            algo, fmt = name.split()
            plain = summarize(samples[f"{algo} float32"]).median
            t = summarize(times).median
            rows.append((nbytes, algo, fmt, t, plain / t, errors[name]))
    if rank == 0:
        print(f"{size} ranks, float32 sum, {pc.local_size()} ranks on this host")
        print("| bytes | algorithm | wire | median ms | speed-up over float32 | worst error |")
        print("|---|---|---|---|---|---|")
        for nbytes, algo, fmt, t, speedup, err in rows:
            print(
                f"| {nbytes >> 20} MiB | {algo} | {fmt} | {t * 1e3:.1f} | {speedup:.2f}x "
                f"| {err:.1e} |"
            )
    pc.shutdown()


if __name__ == "__main__":
    main()
