"""Pulls and updates that meet on one parameter-server task, over shaped links: what one
worker's large read costs the others. Root only (network namespaces, bench/netns_cluster.py).

    sudo "$(command -v pycollective)" bench-ps-contention       # 32 MiB, 1gbit clients, 10gbit ps
    sudo "$(command -v pycollective)" bench-ps-contention --mib 64 --ps-rate 1gbit --json out.json

Three hosts on a bridge: host 0 runs one ps task (its link ``--ps-rate``), hosts 1 and 2 one
client each (``PSClient``, what workers and the coordinator use; links ``--rate``), over tcp as
between machines. The phases, each ``--seconds`` long, with the clients started together:

- pull: host 1 pulls a ``--mib`` MiB float32 variable again and again, alone;
- update: host 2 adds to a 1 KiB variable on the same task again and again, alone;
- update while pulling: both at once; the update's time against its time alone says how long
  an update waits for a pull of another variable;
- update the pulled variable: host 2 adds to the pulled variable itself (``--mib`` MiB, sent
  at its link's rate) while host 1 pulls it;
- two pulls: hosts 1 and 2 pull the variable at once; their time against one pull's says
  whether the task serves two readers side by side (its link is faster than theirs).

Printed: each phase's median, mean, 99th percentile and worst call per client (ms), then the
ratios; ``--json`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from pycollective.bench.ps_bench import TOKEN, Task, stop_group

SMALL = "small"  # a 1 KiB variable
BIG = "big"

# phase name -> (host 1's role, host 2's role); None: that host sits the phase out
PHASES = {
    "pull": ("pull", None),
    "update": (None, "update-small"),
    "update while pulling": ("pull", "update-small"),
    "update the pulled variable": ("pull", "update-big"),
    "two pulls": ("pull", "pull"),
}


# The client (runs in a host's namespace) -----------------------------------------------------


def client(args: argparse.Namespace) -> None:
    """One role for ``args.seconds`` from wall-clock time ``args.at``: prints the seconds of
    each call as JSON."""
    from pycollective.strategies.parameter_server import ps_pb2 as pb
    from pycollective.strategies.parameter_server.client import PSCall, PSClient, PullEntry

    ps = PSClient(TOKEN, 60)
    rows = args.mib * (1 << 20) // 4

    def assign(key: str, value: np.ndarray, kind: str, create: bool = False) -> None:
        request = pb.AssignRequest(keys=[key], kind=kind, create=create, trainable=True)
        ps.call_many([PSCall(args.ps, 0, "Assign", request, arrays=[value])])

    if args.client == "setup":
        assign(BIG, np.zeros(rows, np.float32), "assign", create=True)
        assign(SMALL, np.zeros(256, np.float32), "assign", create=True)
        ps.close()
        print("[]", flush=True)
        return
    out = np.empty(rows, np.float32)
    ones_big, ones_small = np.ones(rows, np.float32), np.ones(256, np.float32)
    call = {
        "pull": lambda: ps.pull([(0, args.ps, [PullEntry(BIG, (rows,), np.float32, out)])]),
        "update-small": lambda: assign(SMALL, ones_small, "assign_add"),
        "update-big": lambda: assign(BIG, ones_big, "assign_add"),
    }[args.client]
    call()  # the channel and its buffers, before the clock starts
    time.sleep(max(0.0, args.at - time.time()))
    times = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    ps.close()
    print(json.dumps(times), flush=True)


# The orchestrator (the machine's own namespace) ------------------------------------------------


def _spawn(cluster, host: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    from pycollective._spawn import own_process_group
    from pycollective.launcher import _die_with_parent

    return subprocess.Popen(
        cluster.rank_command(host, argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=own_process_group(then=_die_with_parent(os.getpid())),
    )


def _run_clients(cluster, env, ps: str, roles, args) -> list[list[float] | None]:
    from pycollective._spawn import python_module_command

    at = time.time() + 4.0  # every client has imported and connected by then
    procs = []
    for host, role in enumerate(roles, start=1):
        if role is None:
            procs.append(None)
            continue
        argv = python_module_command(
            "pycollective.bench.ps_contention",
            *("--client", role, "--ps", ps, "--mib", str(args.mib)),
            *("--seconds", str(args.seconds), "--at", repr(at)),
        )
        procs.append(_spawn(cluster, host, argv, env))
    results = []
    for proc in procs:
        if proc is None:
            results.append(None)
            continue
        try:
            stdout, stderr = proc.communicate(timeout=args.seconds + 120)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise RuntimeError("a client did not finish in time") from None
        if proc.returncode != 0:
            raise RuntimeError(f"a client failed ({proc.returncode}):\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def _summary(times: list[float]) -> dict:
    # Mean and worst beside the median: an update that waits for a pull waits for all of it,
    # rarely (once per pull), so the median of thousands of updates hides it.
    s = sorted(times)
    return {
        "median_ms": statistics.median(s) * 1e3,
        "mean_ms": statistics.fmean(s) * 1e3,
        "p99_ms": s[(len(s) * 99) // 100] * 1e3,
        "max_ms": s[-1] * 1e3,
        "calls": len(s),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="pycollective bench-ps-contention",
        description="A ps task's pulls and updates meeting over shaped links (root).",
    )
    parser.add_argument("--mib", type=int, default=32, help="the pulled variable's size")
    parser.add_argument("--rate", default="1gbit", help="the clients' links (tc rate)")
    parser.add_argument("--ps-rate", default="10gbit", help="the ps task's link (tc rate)")
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase's length")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ps", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client(args)
        return {}

    from pycollective._spawn import child_environment
    from pycollective.bench.netns_cluster import NetnsCluster

    results: dict = {"mib": args.mib, "rate": args.rate, "ps_rate": args.ps_rate, "phases": {}}
    # tcp between the namespaces, as between machines (they share /dev/shm).
    tcp = {"PYCOLLECTIVE_TRANSPORT": "tcp"}
    env = dict(child_environment(), PYCOLLECTIVE_TOKEN=TOKEN, **tcp)
    with NetnsCluster(3, 1, args.rate, subnet="10.78.0") as cluster:
        cluster.shape(0, args.ps_rate)
        ps = Task("ps", 0, cluster.address(0), lambda argv: cluster.rank_command(0, argv), tcp)
        try:
            _run_clients(cluster, env, ps.address, ("setup", None), args)
            for phase, roles in PHASES.items():
                times = _run_clients(cluster, env, ps.address, roles, args)
                results["phases"][phase] = {
                    f"host {h} {role}": _summary(t)
                    for h, (role, t) in enumerate(zip(roles, times), start=1)
                    if t is not None
                }
        finally:
            ps.stop()
    phases = results["phases"]
    alone = phases["update"]["host 2 update-small"]
    during = phases["update while pulling"]["host 2 update-small"]
    two = phases["two pulls"]
    results["ratios"] = {
        "update while pulling / alone, mean": during["mean_ms"] / alone["mean_ms"],
        "update while pulling / alone, worst": during["max_ms"] / alone["max_ms"],
        "two pulls (the slower) / one pull, medians": max(
            two["host 1 pull"]["median_ms"], two["host 2 pull"]["median_ms"]
        )
        / phases["pull"]["host 1 pull"]["median_ms"],
    }
    print(f"# ps task contention: {args.mib} MiB variable, clients {args.rate}, ps {args.ps_rate}")
    print(f"{'phase':>28}  {'client':<20} {'median':>9} {'mean':>9} {'p99':>9} {'worst':>9}  calls")
    for phase, clients in phases.items():
        for who, s in clients.items():
            print(
                f"{phase:>28}  {who:<20} {s['median_ms']:9.1f} {s['mean_ms']:9.1f} "
                f"{s['p99_ms']:9.1f} {s['max_ms']:9.1f}  {s['calls']}"
            )
    for name, value in results["ratios"].items():
        print(f"{name}: {value:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
