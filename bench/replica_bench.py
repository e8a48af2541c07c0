"""ReplicaGroup's native hierarchical all-reduce against the three-step composition it replaced
in MultiWorkerBackend (reduce the local replicas to replica 0, all-reduce that across processes,
broadcast it back), side by side in one run, interleaved.

    pycollective run -n 2 python -m pycollective.bench.replica_bench --replicas 2

Rank 0 prints a markdown table: median milliseconds per all-reduce (float32 sum), the better of
two interleaved rounds each, and the speed-up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pycollective as pc

SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2, help="replicas per process")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest size measured")
    args = parser.parse_args()
    local_replicas = args.replicas
    pc.init()
    local = pc.LocalCommunicator(local_replicas)
    group = pc.ReplicaGroup(local_replicas)

    def composition(xs: list[np.ndarray]) -> list[np.ndarray]:
        buf = local.reduce(xs, root=0, op="sum")[0]
        pc.allreduce(buf, op="sum", inplace=True)
        others = [np.empty_like(buf) for _ in range(local_replicas - 1)]
        return local.broadcast([buf] + others, root=0)

    def native(xs: list[np.ndarray]) -> list[np.ndarray]:
        return group.allreduce(xs, op="sum")

    def median_seconds(fn, xs: list[np.ndarray], reps: int) -> float:
        times = []
        for _ in range(reps):
            pc.barrier()
            start = time.perf_counter()
            fn(xs)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    rows = []
    for nbytes in (s for s in SIZES if s <= args.max_bytes):
        xs = [np.full(nbytes // 4, float(i + 1), np.float32) for i in range(local_replicas)]
        want = pc.world_size() * sum(range(1, local_replicas + 1))
        for fn in (native, composition):
            if not all(np.all(y == want) for y in fn(xs)):
                raise SystemExit(f"{fn.__name__}: wrong result at {nbytes} bytes")
        reps = 30 if nbytes <= 1 << 20 else 10
        c1, n1 = median_seconds(composition, xs, reps), median_seconds(native, xs, reps)
        n2, c2 = median_seconds(native, xs, reps), median_seconds(composition, xs, reps)
        rows.append((nbytes, min(c1, c2), min(n1, n2)))
    if pc.rank() == 0:
        print(f"{pc.world_size()} processes x {local_replicas} replicas, float32 sum")
        print("| bytes per replica | composition (ms) | native hierarchical (ms) | speed-up |")
        print("|---|---|---|---|")
        for nbytes, c, n in rows:
            print(f"| {nbytes >> 10} KiB | {c * 1e3:.3f} | {n * 1e3:.3f} | {c / n:.2f}x |")
    pc.shutdown()


if __name__ == "__main__":
    main()
