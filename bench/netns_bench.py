"""Every all-reduce algorithm across shaped network namespaces (bench/netns_cluster.py), beside
the link-bound limit and the cost model's estimate. Root only; not a test (minutes long).

    sudo "$(command -v pycollective)" bench-netns --markdown table.md --json rows.json

For each layout (HOSTSxRANKS_PER_HOST) and link rate it starts the cluster and runs the
benchmark worker (bench/worker.py) in every rank, the ranks found from torchrun's variables:
each size checked against numpy, then every algorithm timed in interleaved rounds (the slowest
rank's time per iteration; medians). Ranks of one host talk over shm, hosts over TCP through
their shaped links.

The link-bound limit: all-reduce over H hosts, each with one link of B bit/s each way, must send
and receive at least 2(H-1)/H x S bytes per host (every host's part of the result needs the
other hosts' contributions, and every host needs every part; Patarasuk and Yuan's bound, with
hosts as the nodes: ranks inside a host exchange through memory, off the link), so no schedule
beats 2(H-1)/H x 8S/B seconds. For 2 hosts that is one message each way: 64 MiB at 1 Gbit/s
takes 537 ms.

The model's estimate is pycollective/cost_model.py's, for the same layout, with the host link
set to the cluster's rate through PYCOLLECTIVE_LINK_GBITS (what a user declares for their
network), unless --probe measures it first (bench/link_probe.py, in the same cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from pycollective._spawn import child_environment, python_module_command

from .metrics import human_bytes, parse_size
from .netns_cluster import ClusterError, NetnsCluster, check_can_build, parse_rate

LINK_KNOB, TUNING_KNOB = "PYCOLLECTIVE_LINK_GBITS", "PYCOLLECTIVE_TUNING"
ALGOS = ["ring", "hierarchical", "halving_doubling", "reduce_to_one", "auto"]


def link_bound_s(hosts: int, nbytes: int, rate_bps: float) -> float:
    """The least time an all-reduce of nbytes can take over hosts with one link of rate_bps."""
    return 2 * (hosts - 1) / hosts * nbytes * 8 / rate_bps


def run_layout(
    hosts: int,
    per_host: int,
    rate: str,
    sizes: list[int],
    algos: list[str],
    probe: bool,
    workdir: str,
) -> dict:
    """One cluster: the worker's rows, auto's pick per size and the model's estimates."""
    from pycollective import cost_model

    tag = f"{hosts}x{per_host}-{rate}"
    job = {
        "backend": "pycollective",
        "transport": None,  # per peer: shm on one host, tcp across hosts
        "collective": "allreduce",
        "sizes": sizes,
        "dtype": "float32",
        "op": "sum",
        "algos": algos,
        "iters": 16,
        "warmup": 1,
        "budget": 0.5,
        "result": os.path.join(workdir, f"rows-{tag}.json"),
    }
    job_path = os.path.join(workdir, f"job-{tag}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    rate_bps = parse_rate(rate)
    assert rate_bps is not None
    from pycollective import config

    # What the ranks' groups read: the model's host link, declared or measured by the probe.
    env = child_environment({k: v for k, v in os.environ.items() if k != LINK_KNOB})
    with NetnsCluster(hosts, per_host, rate) as cluster:
        if probe:
            env[TUNING_KNOB] = os.path.join(workdir, f"tuning-{tag}.json")
            code = cluster.run(
                python_module_command("pycollective.bench.link_probe"),
                timeout=300,
                logdir=os.path.join(workdir, f"logs-probe-{tag}"),
                env=env,
            )
            if code != 0:
                raise SystemExit(f"{tag}: the link probe failed (status {code})")
        else:
            env[LINK_KNOB] = str(rate_bps / 1e9)
        code = cluster.run(
            python_module_command("pycollective.bench.worker", job_path),
            timeout=1800,
            logdir=os.path.join(workdir, f"logs-{tag}"),
            env=env,
        )
        if code != 0 or not os.path.exists(job["result"]):
            raise SystemExit(f"{tag}: the benchmark ranks failed (status {code})")
    # The model as the ranks saw it: the same variables, read the same way; with the probe,
    # also the model of a user who declared the cluster's rate instead.
    declared = dict(env, **{LINK_KNOB: str(rate_bps / 1e9)})
    models = {}
    for name, variables in (("model", env), ("declared", declared)):
        config.reload(variables)
        try:
            local, remote = cost_model.link_costs()
            layout = cost_model.layout(hosts, per_host)
            models[name] = {
                "local_cost": local,
                "remote_cost": remote,
                "sizes": {
                    str(n): _estimate(cost_model.estimate(layout, n, local=local, remote=remote))
                    for n in sizes
                },
            }
        finally:
            config.reload()
    with open(job["result"]) as f:
        rows = json.load(f)
    return {
        "hosts": hosts,
        "ranks_per_host": per_host,
        "rate": rate,
        "rate_bps": rate_bps,
        "probed": probe,
        "rows": rows,
        **models,
    }


def _estimate(e) -> dict:
    return {"seconds": e.seconds, "auto": e.auto, "unsupported": e.unsupported}


def markdown(results: list[dict]) -> str:
    """One table per layout and rate: every algorithm, measured against the limit and model."""
    out = []
    for res in results:
        hosts, per_host = res["hosts"], res["ranks_per_host"]
        models = [res["model"]] + ([res["declared"]] if res["probed"] else [])
        heads = [
            f"model ({'link probed' if i == 0 and res['probed'] else 'rate declared'}: "
            f"{8 / m['remote_cost'][1] / 1e9:.3g} Gbit/s)"
            for i, m in enumerate(models)
        ]
        out.append(f"**{hosts} hosts x {per_host} ranks, links {res['rate']}**\n")
        out.append(
            "| size | algorithm | measured (median) | link-bound | measured / bound | "
            + " | ".join(heads)
            + " | auto ran |"
        )
        out.append("|---" * (6 + len(models)) + "|")
        by_size: dict[int, list[dict]] = {}
        for r in res["rows"]:
            by_size.setdefault(r["nbytes"], []).append(r)
        for nbytes in sorted(by_size):
            bound = link_bound_s(hosts, nbytes, res["rate_bps"])
            algos_here = [r for r in by_size[nbytes] if r["algo"] != "auto"]
            best = min(algos_here, key=lambda r: r["median_s"])
            for r in by_size[nbytes]:
                algo = r["algo"]
                predicted = []
                for m in models:
                    e = m["sizes"][str(nbytes)]
                    t = e["seconds"].get(algo if algo != "auto" else e["auto"])
                    # hierarchical's model leaves a layout of one rank per host to the ring
                    shown = "- (a ring)" if t is None or t > 1e29 else _ms(t)
                    predicted.append(shown + (f" ({e['auto']})" if algo == "auto" else ""))
                pick = ""
                if algo == "auto":
                    ratio = r["median_s"] / best["median_s"]
                    pick = f"{r['chose']}: {ratio:.2f}x the best ({best['algo']})"
                bad = " (WRONG RESULT)" if r["wrong"] else ""
                out.append(
                    f"| {human_bytes(nbytes)} | {algo}{bad} | {_ms(r['median_s'])} | "
                    f"{_ms(bound)} | {r['median_s'] / bound:.2f} | "
                    + " | ".join(predicted)
                    + f" | {pick} |"
                )
        out.append("")
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="netns_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", default="2x2,4x1", help="HOSTSxRANKS_PER_HOST, comma-separated")
    p.add_argument("--rates", default="1gbit,10gbit", help="tc rates, comma-separated")
    p.add_argument("--sizes", default="1M,16M,64M", help="bytes per rank, comma-separated")
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument(
        "--probe",
        action="store_true",
        help="measure the host link for the model "
        "(bench/link_probe.py) instead of declaring the cluster's rate",
    )
    p.add_argument("--json", default=None, help="write every row and estimate here")
    p.add_argument("--markdown", default=None, help="write the tables here")
    args = p.parse_args(argv)
    try:
        check_can_build()
    except ClusterError as exc:
        print(f"netns_bench: {exc}", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    algos = [a for a in args.algos.split(",") if a]
    results = []
    with tempfile.TemporaryDirectory(prefix="pycol-netns-bench-") as workdir:
        for layout in args.layouts.split(","):
            hosts, per_host = (int(x) for x in layout.lower().split("x"))
            for rate in args.rates.split(","):
                print(f"# {hosts} hosts x {per_host} ranks at {rate} ...", flush=True)
                results.append(run_layout(hosts, per_host, rate, sizes, algos, args.probe, workdir))
                if args.json:  # after every cluster: a long run keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=1)
    text = markdown(results)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
