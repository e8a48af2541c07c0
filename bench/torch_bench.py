"""torch.distributed through "pycollective" against "gloo", in the same processes.

    pycollective bench-torch                 # 2 and 4 ranks, 4 KiB .. 64 MiB
    pycollective bench-torch --worlds 2 --json out.json

For each world size, one set of rank processes (under a hard deadline) forms the default group
on "pycollective" and a gloo group over the same ranks, then times, in interleaved rounds so
both share the machine's noise: ``torch.distributed.all_reduce`` (float32 sum, in place),
``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (FSDP's two collectives; a size is the
larger side, the input of a reduce-scatter and the output of an all-gather) at each size, and
DistributedDataParallel training steps of an ~11M-parameter MLP. Times are the slowest rank's
per iteration (median); busbw follows nccl-tests. Every result is checked against numpy first.
The summary compares all_reduce with the goals of issue #14, and the other two with gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from pycollective._ports import PortReservation
from pycollective._spawn import child_environment, in_own_process_group, python_module_command

from .metrics import human_bytes, parse_size
from .procs import kill_rank_groups
from .report import table
from .rows import Row
from .timing import summarize, time_interleaved

BACKENDS = ("pycollective", "gloo")
# Our collectives' names (the rows' and the JSON's) and the torch.distributed call each times.
COLLECTIVES = {
    "allreduce": "all_reduce",
    "reduce_scatter": "reduce_scatter_tensor",
    "allgather": "all_gather_into_tensor",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pycollective bench-torch", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--worlds", default="2,4", help="comma-separated rank counts")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument(
        "-c",
        "--collectives",
        default=",".join(COLLECTIVES),
        help=f"comma-separated, from {','.join(COLLECTIVES)}",
    )
    p.add_argument("-n", "--iters", type=int, default=200)
    p.add_argument(
        "--budget",
        type=float,
        default=1.5,
        help="seconds of all_reduce timing per size and backend at most",
    )
    p.add_argument(
        "--ddp-steps", type=int, default=12, help="timed DDP steps per backend (0: skip DDP)"
    )
    p.add_argument("--ddp-worlds", default="2", help="rank counts that time DDP")
    p.add_argument("--batch", type=int, default=32, help="DDP batch per rank")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--worker", metavar="JOB", help=argparse.SUPPRESS)
    return p


# -- one rank ---------------------------------------------------------------------------------


def mlp(width: int = 2048):
    """~11.0M parameters: 1024 -> 2048 -> 2048 -> 2048 -> 256."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Linear(1024, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 256),
    )


def _rank_input(collective: str, count: int, rank: int, world: int):
    """Rank `rank`'s input (float32; `count` is the larger side): a different value at every
    position and rank, small integers, so that sums are exact."""
    import numpy as np

    n = count // world if collective == "allgather" else count
    return (np.arange(n) % 13 + rank + 1).astype(np.float32)


def _expected(collective: str, count: int, rank: int, world: int):
    import numpy as np

    inputs = [_rank_input(collective, count, q, world) for q in range(world)]
    if collective == "allgather":
        return np.concatenate(inputs)
    total = np.sum(inputs, axis=0)
    return total if collective == "allreduce" else np.split(total, world)[rank]


def _call(collective: str, x, out, group):
    """The torch.distributed call of `collective` on these tensors (allreduce: in place, on x)."""
    import torch.distributed as dist

    if collective == "allreduce":
        return lambda: dist.all_reduce(x, group=group)
    # torch 2.13 renamed both (the old names warn); the calls are the same.
    if collective == "reduce_scatter":
        run = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: run(out, x, group=group)
    run = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    return lambda: run(out, x, group=group)


def _output(collective: str, count: int, world: int):
    import torch

    return (
        None
        if collective == "allreduce"
        else torch.empty(count // world if collective == "reduce_scatter" else count)
    )


def _check(collective: str, count: int, rank: int, world: int, group) -> int:
    """One call on `group`; the number of its result's elements that differ from numpy's."""
    import torch

    x = torch.from_numpy(_rank_input(collective, count, rank, world))
    out = _output(collective, count, world)
    _call(collective, x, out, group)()
    got = (x if out is None else out).numpy()
    return int((got != _expected(collective, count, rank, world)).sum())


def _timed(collective: str, count: int, world: int, group):
    """The call to time: zeros, so that the in-place all_reduce, called again and again, never
    overflows."""
    import torch

    n = count // world if collective == "allgather" else count
    return _call(collective, torch.zeros(n), _output(collective, count, world), group)


def _worker(job_path: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pycollective.torch  # noqa: F401  (registers the backend)

    with open(job_path) as f:
        job = json.load(f)
    rank, world = int(os.environ["BENCH_RANK"]), job["world"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "pycollective", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=world
    )
    gloo = dist.new_group(backend="gloo")
    groups = {"pycollective": None, "gloo": gloo}

    def slowest(samples: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float64))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return t.numpy()

    settle_calls = dist.group.WORLD.pycollective_group.auto_trial_calls
    out: dict = {c: [] for c in job["collectives"]}
    out["ddp"] = {}
    for collective in job["collectives"]:
        for nbytes in job["sizes"]:
            count = max(world, nbytes // 4 // world * world)  # a whole share for every rank
            wrong = {
                name: _check(collective, count, rank, world, group)
                for name, group in groups.items()
            }
            calls = {
                name: _timed(collective, count, world, group) for name, group in groups.items()
            }
            # auto's trial, where it measures (a training loop's first calls of a shape): timed
            # from its settled choice on, as `pycollective bench` times it.
            for _ in range(settle_calls):
                calls["pycollective"]()
            samples = time_interleaved(
                calls, job["iters"], 3, job["budget"], max_over_ranks=slowest
            )
            for name in groups:
                s = summarize(samples[name])
                out[collective].append(
                    {
                        "backend": name,
                        "nbytes": count * 4,
                        "count": count,
                        "median_s": s.median,
                        "p10_s": s.p10,
                        "p90_s": s.p90,
                        "iters": s.iters,
                        "wrong": wrong[name],
                    }
                )
            if rank == 0:
                print(f"done {collective} {human_bytes(nbytes)} on {world} ranks", flush=True)

    if job["ddp_steps"] > 0:
        g = torch.Generator().manual_seed(rank)
        x, y = (
            torch.randn(job["batch"], 1024, generator=g),
            torch.randn(job["batch"], 256, generator=g),
        )
        steps = {}
        for name, group in groups.items():
            torch.manual_seed(0)
            model = DDP(mlp(), process_group=group)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)

            def step(model=model, opt=opt) -> None:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()

            steps[name] = step
        params = sum(p.numel() for p in mlp().parameters())
        samples = time_interleaved(
            steps, job["ddp_steps"], 2, 1e9, rounds=4, max_over_ranks=slowest
        )
        out["ddp"] = {
            name: {
                "median_s": summarize(s).median,
                "p10_s": summarize(s).p10,
                "p90_s": summarize(s).p90,
                "steps": len(s),
                "params": params,
            }
            for name, s in samples.items()
        }
        if rank == 0:
            print(f"done DDP on {world} ranks", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        with open(job["result"], "w") as f:
            json.dump(out, f)


# -- the driver -------------------------------------------------------------------------------


def run_world(world: int, job: dict, deadline_s: float) -> dict:
    """One set of `world` rank processes under a hard deadline; rank 0's figures."""
    # The store's port is held until the ranks are gone (pycollective/_ports.py).
    with PortReservation(1) as reserved:
        return _run_ranks(world, dict(job, port=reserved.ports[0]), deadline_s)


def _run_ranks(world: int, job: dict, deadline_s: float) -> dict:
    # The job's folder goes with the call: a failure's log tails are in the error.
    with tempfile.TemporaryDirectory(
        prefix="pycol-torch-bench-", ignore_cleanup_errors=True
    ) as tmp:
        return _run_job_in(tmp, world, job, deadline_s)


def _run_job_in(tmp: str, world: int, job: dict, deadline_s: float) -> dict:
    job = dict(job, world=world, result=os.path.join(tmp, "result.json"))
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    procs = [
        subprocess.Popen(
            python_module_command("pycollective.bench.torch_bench", "--worker", path),
            env=dict(child_environment(), BENCH_RANK=str(r)),
            stdout=subprocess.PIPE if r else None,
            stderr=subprocess.STDOUT,
            text=True,
            **in_own_process_group(),
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + deadline_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:  # past the deadline, and on Ctrl-C (the ranks' process groups do not get it)
        kill_rank_groups(procs)
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed or not os.path.exists(job["result"]):
        logs = "\n".join((p.stdout.read() or "")[-2000:] for p in procs[1:] if p.stdout)
        raise SystemExit(
            f"{world} ranks: ranks {failed} failed or ran past {deadline_s:.0f} s\n{logs}"
        )
    with open(job["result"]) as f:
        return json.load(f)


def _rows(world: int, collective: str, measured: list[dict]) -> list[Row]:
    return [
        Row(
            collective,
            d["nbytes"],
            d["count"],
            "float32",
            d["backend"],
            "shm" if d["backend"] == "pycollective" else "tcp",
            world,
            d["median_s"],
            d["p10_s"],
            d["p90_s"],
            d["wrong"],
            peer=d["backend"] == "gloo",
        )
        for d in measured
    ]


def report(results: dict[int, dict]) -> list[str]:
    """A table a collective; all_reduce's lines against each goal of issue #14 (met or not) and
    the DDP line; the other collectives' speed against gloo at the smallest and largest size."""
    collectives = [c for c in COLLECTIVES if any(c in res for res in results.values())]
    for collective in collectives:
        print(f"torch.distributed.{COLLECTIVES[collective]}:")
        table(
            [r for w, res in results.items() for r in _rows(w, collective, res[collective])],
            sys.stdout,
        )
    lines = []
    for world, res in results.items():
        for collective in collectives:
            by = {(r.algo, r.nbytes): r for r in _rows(world, collective, res[collective])}
            sizes = sorted({n for _, n in by})
            big, small = sizes[-1], sizes[0]
            pc, gloo = by["pycollective", big], by["gloo", big]
            if collective != "allreduce":
                for size in sorted({small, big}):
                    pc, gloo = by["pycollective", size], by["gloo", size]
                    lines.append(
                        f"{world} ranks, {COLLECTIVES[collective]} {human_bytes(size)}: "
                        f"{pc.median_s * 1e6:.1f} us vs gloo {gloo.median_s * 1e6:.1f} us = "
                        f"{gloo.median_s / pc.median_s:.2f}x gloo's speed"
                    )
                continue
            ratio = pc.busbw / gloo.busbw
            lines.append(
                f"{world} ranks, all_reduce {human_bytes(big)}: busbw "
                f"{pc.busbw / 1e9:.2f} GB/s vs gloo {gloo.busbw / 1e9:.2f} GB/s = {ratio:.2f}x "
                f"(goal >= 3x: {'met' if ratio >= 3 else 'not met'})"
            )
            pc, gloo = by["pycollective", small], by["gloo", small]
            lat = pc.median_s / gloo.median_s
            lines.append(
                f"{world} ranks, all_reduce {human_bytes(small)}: "
                f"{pc.median_s * 1e6:.1f} us vs gloo {gloo.median_s * 1e6:.1f} us = {lat:.3f}x "
                f"(goal <= 0.1x: {'met' if lat <= 0.1 else 'not met'})"
            )
        ddp = res.get("ddp") or {}
        if ddp:
            p, g = ddp["pycollective"], ddp["gloo"]
            r = p["median_s"] / g["median_s"]
            lines.append(
                f"{world} ranks, DDP step ({p['params'] / 1e6:.1f}M-parameter MLP): "
                f"{p['median_s'] * 1e3:.0f} ms ({1 / p['median_s']:.2f} steps/s) vs "
                f"gloo {g['median_s'] * 1e3:.0f} ms ({1 / g['median_s']:.2f} steps/s) "
                f"= {r:.2f}x (goal <= 0.8x: {'met' if r <= 0.8 else 'not met'})"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    sizes, s = [], args.minbytes
    while s <= args.maxbytes:
        sizes.append(s)
        s *= args.stepfactor
    collectives = [c for c in args.collectives.split(",") if c]
    unknown = set(collectives) - set(COLLECTIVES)
    if unknown or not collectives:
        raise SystemExit(f"unknown collectives {sorted(unknown)}; choose from {list(COLLECTIVES)}")
    ddp_worlds = {int(w) for w in args.ddp_worlds.split(",") if w}
    results = {}
    for world in (int(w) for w in args.worlds.split(",")):
        job = {
            "collectives": collectives,
            "sizes": sizes,
            "iters": args.iters,
            "budget": args.budget,
            "ddp_steps": args.ddp_steps if world in ddp_worlds else 0,
            "batch": args.batch,
        }
        timing_s = 4 * args.budget * len(sizes) * len(BACKENDS) * len(collectives)
        results[world] = run_world(world, job, 120 + timing_s + (60 + 10 * args.ddp_steps) * world)
    lines = report(results)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "summary": lines}, f, indent=1)
    wrong = sum(d["wrong"] for res in results.values() for c in collectives for d in res[c])
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
