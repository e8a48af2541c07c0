"""Measures the link between hosts for the cost model; run it as every rank of the cluster,
under the cluster's launcher (torchrun, srun, mpirun, bench/netns_cluster.sh, ...):

    srun -N 4 python -m pycollective.bench.link_probe --output ~/pycollective-tuning.json

One rank per host (local rank 0) joins a ring all-reduce across the hosts, one message per host
link each way at a time, at a small and a large size; the alpha-beta-gamma fit of the ring
(bench/tune.py's fit_costs) gives the host link's cost, which rank 0 stores as ``"host_link"`` in
the tuning file (other entries kept). Groups created with PYCOLLECTIVE_TUNING naming that file
then price cross-host steps with it (pycollective/cost_model.py), unless PYCOLLECTIVE_LINK_GBITS
says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from .rows import Row
from .tune import fit_costs, measure_gamma

SMALL, LARGE = 4 << 10, 16 << 20
ITERS = 5


def _median_seconds(pc, x: np.ndarray, group) -> float:
    out = np.empty_like(x)
    pc.allreduce(x, algo="ring", out=out, group=group)  # warm-up: connections, pages
    times = []
    for _ in range(ITERS):
        pc.barrier(group=group)
        t0 = time.perf_counter()
        pc.allreduce(x, algo="ring", out=out, group=group)
        times.append(time.perf_counter() - t0)
    # Every leader's slowest sample is the ring's: take the max over leaders per iteration.
    slowest = pc.allreduce(np.array(times), op="max", algo="ring", group=group)
    return float(statistics.median(slowest))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="link_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default=None, help="tuning file (default: $PYCOLLECTIVE_TUNING)")
    args = p.parse_args(argv)
    import pycollective as pc
    from pycollective import config, tuning
    from pycollective.cost_model import HOST_LINK

    path = args.output or config.text("PYCOLLECTIVE_TUNING")
    if not path:
        print("link_probe: give --output or set PYCOLLECTIVE_TUNING", file=sys.stderr)
        return 2
    pc.init()
    is_leader = pc.local_rank() == 0
    flags = pc.allgather(np.array([1 if is_leader else 0], np.int64))
    leaders = [r for r, f in enumerate(np.asarray(flags).reshape(-1)) if f]
    if len(leaders) < 2:
        if pc.rank() == 0:
            print(
                "link_probe: every rank is on one host; nothing crosses a host link",
                file=sys.stderr,
            )
        pc.shutdown()
        return 2
    group = pc.new_group(leaders)
    result = 0
    if group is not None:
        rows = []
        for nbytes in (SMALL, LARGE):
            x = np.ones(nbytes // 4, np.float32)
            seconds = _median_seconds(pc, x, group)
            rows.append(
                Row(
                    "allreduce",
                    nbytes,
                    x.size,
                    "float32",
                    "ring",
                    "tcp",
                    len(leaders),
                    seconds,
                    seconds,
                    seconds,
                    0,
                )
            )
        cost = fit_costs(rows, len(leaders), measure_gamma())
        if pc.rank() == 0 and cost is not None:
            tuned = tuning.load(path) or tuning.Tuning()
            tuned.costs[HOST_LINK] = cost
            tuning.save(tuned, path)
            alpha, beta, _ = cost
            print(
                f"host link ({len(leaders)} hosts): alpha {alpha * 1e6:.0f} us, "
                f"{8 / beta / 1e9:.3g} Gbit/s; wrote {HOST_LINK!r} to {path}"
            )
        result = 0 if cost is not None else 1
    pc.barrier()
    pc.shutdown()
    return result


if __name__ == "__main__":
    sys.exit(main())
