"""Joins the process group from the launcher's environment and checks an all-reduce against numpy.

    srun -n 4 python examples/allreduce_check.py
    mpirun -n 4 python examples/allreduce_check.py

Every rank contributes arrays of several sizes (empty, one element, a prime, larger than a
pipeline chunk), sums them with ``pc.allreduce`` and compares with the sum numpy computes from
every rank's inputs, which each rank can regenerate from the seeds. Prints one JSON line per
rank (rank, world size, local rank and size, whether every result matched) and exits 1 on a
mismatch, so a launcher's exit code says whether the group works.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import pycollective as pc

SIZES = [0, 1, 7, 1009, 100_003]


def contribution(rank: int, size: int, dtype: type) -> np.ndarray:
    # Small integers: every sum is exact, in float32 as in int64, whatever the order of adds.
    return np.random.default_rng(1000 * rank + size).integers(-50, 50, size).astype(dtype)


def main() -> int:
    pc.init()
    rank, world = pc.rank(), pc.world_size()
    mismatches = []
    for dtype in (np.float32, np.int64):
        for size in SIZES:
            mine = contribution(rank, size, dtype)
            expected = sum(contribution(r, size, dtype) for r in range(world))
            got = pc.allreduce(mine)
            if got.dtype != dtype or not np.array_equal(got, expected):
                mismatches.append(f"{np.dtype(dtype).name}[{size}]")
    report = {
        "rank": rank,
        "world_size": world,
        "local_rank": pc.local_rank(),
        "local_size": pc.local_size(),
        "ok": not mismatches,
        "mismatches": mismatches,
    }
    print(json.dumps(report), flush=True)
    pc.shutdown()
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
