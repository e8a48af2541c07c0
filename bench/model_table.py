"""The cost model's all-reduce estimates for a cluster you do not have: no group is formed,
nothing is measured (pycollective/cost_model.py). An extrapolation, not a measurement.

    pycollective bench-model 64x8 --gbits 10,100 --sizes 1M,64M

Link costs: the host link at each --gbits rate (alpha and gamma from the tcp cost), ranks of a
host over shm; both from the defaults, or from PYCOLLECTIVE_TUNING where it names a file.
"""

from __future__ import annotations

import argparse
import sys

from .metrics import human_bytes, parse_size

ALGOS = ["ring", "hierarchical", "halving_doubling"]


def table(hosts: int, per_host: int, gbits: list[float], sizes: list[int]) -> str:
    from pycollective import cost_model

    local, tcp = cost_model.link_costs()
    layout = cost_model.layout(hosts, per_host)
    out = [
        f"| link | size | {' | '.join(ALGOS)} | auto picks | link-bound |",
        "|---" * (len(ALGOS) + 4) + "|",
    ]
    for rate in gbits:
        remote = (tcp[0], 8 / (rate * 1e9), tcp[2])
        for n in sizes:
            # cores=0: the cluster's ranks each have a core (or a device) of their own.
            e = cost_model.estimate(layout, n, local=local, remote=remote, cores=0)
            cells = [_ms(e.seconds[a]) if e.seconds.get(a, 1e30) < 1e29 else "-" for a in ALGOS]
            bound = 2 * (hosts - 1) / hosts * n * 8 / (rate * 1e9)
            out.append(
                f"| {rate:g} Gbit/s | {human_bytes(n)} | {' | '.join(cells)} | {e.auto} | "
                f"{_ms(bound)} |"
            )
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="model_table", description=__doc__.split("\n\n")[0])
    p.add_argument("layout", help="HOSTSxRANKS_PER_HOST, e.g. 64x8")
    p.add_argument("--gbits", default="10,100", help="host link rates, Gbit/s, comma-separated")
    p.add_argument("--sizes", default="1M,64M", help="bytes per rank, comma-separated")
    args = p.parse_args(argv)
    hosts, per_host = (int(x) for x in args.layout.lower().split("x"))
    gbits = [float(g) for g in args.gbits.split(",") if g]
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    print(table(hosts, per_host, gbits, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
