"""ParameterServerStrategy benchmark: pull/push throughput and training steps per second.

    pycollective bench-ps                 # from any directory, after pip install
    pycollective bench-ps --mib 64 --steps 300 --json out.json --plot scaling.png

Starts 2 ps tasks and up to 8 worker tasks as processes on this machine (OS-chosen ports), then
measures, in the same run:

- pull / push / assign throughput of one ``--mib`` MiB float32 variable split into 2 shards (one
  per ps task), from the coordinator: pull = read the whole variable, push = gradients of the
  whole variable applied with SGD on the parameter servers, assign = overwrite it. The rounds
  interleave one loopback TCP stream of the same size (bench.ceilings) with one pull, push and
  assign; each is reported as the median over rounds of its ratio to that round's stream (a
  shared, loaded machine drifts between rounds: a ratio measured side by side carries the
  result), beside the medians in GB/s.
- steps per second of the digits softmax-regression model (batch 32, SGD) trained with 1, 2, 4
  and 8 workers asynchronously, and with 2 workers synchronously (also as milliseconds per
  synchronous update, which takes one step from each worker), against the same model in a bare
  single-process numpy loop (no strategy, no network). Every run also checks that the
  optimizer's iteration count on the ps tasks grew by exactly the number of steps (no update
  lost or applied twice).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import numpy as np

from pycollective._spawn import child_environment, own_process_group, python_module_command
from pycollective.bench.ceilings import loopback_tcp_bandwidth
from pycollective.launcher import _die_with_parent
from pycollective.strategies import (
    SGD,
    ClusterCoordinator,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    SimpleClusterResolver,
    Variable,
)

TOKEN = "ps-bench"


class Task:
    """A ps or worker process on an OS-chosen port of ``host``. ``wrap`` turns its command
    into the one to run (e.g. inside a network namespace); ``env``: variables beside the
    cluster's."""

    def __init__(
        self,
        job: str,
        index: int,
        host: str = "127.0.0.1",
        wrap: Callable[[list[str]], list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        env = dict(
            child_environment(),
            **(env or {}),
            PYCOLLECTIVE_TOKEN=TOKEN,
            PYTHONUNBUFFERED="1",
            TF_CONFIG=json.dumps(
                {
                    "cluster": {job: [f"{host}:0"] * (index + 1)},
                    "task": {"type": job, "index": index},
                }
            ),
        )
        command = python_module_command("pycollective.strategies.parameter_server")
        self.process = subprocess.Popen(
            wrap(command) if wrap else command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=own_process_group(then=_die_with_parent(os.getpid())),
        )  # never outlive the benchmark
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [
                lines.put(raw.decode().rstrip()) for raw in iter(self.process.stdout.readline, b"")
            ],
            daemon=True,
        ).start()
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"{job} {index} did not start") from None
            if " serving on " in line:
                self.address = line.rsplit(" ", 1)[-1]
                break

    def stop(self) -> None:
        stop_group(self.process)


def stop_group(process: subprocess.Popen) -> None:
    """Ends a child started in a process group of its own: SIGTERM, then SIGKILL after 5 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


# The digits model ----------------------------------------------------------------------------------


def load_digits_data():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def gradients(w, b, x, y):
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    d = (p / len(y)).astype(np.float32)
    return x.T @ d, d.sum(axis=0)


def numpy_steps_per_second(x, y, steps: int, batch: int) -> float:
    w, b = np.zeros((64, 10), np.float32), np.zeros(10, np.float32)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        rows = rng.integers(0, len(x), batch)
        gw, gb = gradients(w, b, x[rows], y[rows])
        w -= np.float32(0.5) * gw
        b -= np.float32(0.5) * gb
    return steps / (time.perf_counter() - start)


def cluster_steps_per_second(cluster, mode: str, x, y, steps: int, batch: int) -> float:
    """Steps per second of ``steps`` scheduled steps (after 20 warm-up steps); RuntimeError
    when the ps tasks applied another number of updates than the steps asked for."""
    strategy = ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0), update_mode=mode, token=TOKEN
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        w = Variable(np.zeros((64, 10), np.float32), name="w")
        b = Variable(np.zeros(10, np.float32), name="b")
        opt = SGD(0.5)

    def dataset_fn(ctx):
        rng = np.random.default_rng(ctx.input_pipeline_id)
        while True:
            rows = rng.integers(0, len(x), batch)
            yield x[rows], y[rows]

    def step(iterator):
        xb, yb = next(iterator)
        gw, gb = gradients(np.asarray(w), np.asarray(b), xb, yb)
        opt.apply_gradients([(gw, w), (gb, b)])
        return 0

    workers = len(cluster["worker"])
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    warmup = 20 if mode == "async" else 20 * workers  # sync: whole steps of every worker
    for _ in range(warmup):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    before = int(opt.iterations.numpy())
    start = time.perf_counter()
    for _ in range(steps):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    elapsed = time.perf_counter() - start
    applied = int(opt.iterations.numpy()) - before
    expected = steps if mode == "async" else steps // workers
    coordinator.close()
    if applied != expected:
        raise RuntimeError(
            f"{mode} training with {workers} workers applied {applied} updates for {steps} "
            f"steps (expected {expected}): updates were lost or applied twice"
        )
    return steps / elapsed


def transfer_rounds(cluster, mib: int, repeats: int) -> dict:
    """Pull, push and assign of a ``mib`` MiB variable in 2 shards, interleaved with a
    loopback TCP stream of the same size, ``repeats`` rounds after a warm-up round."""
    strategy = ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0),
        variable_partitioner=FixedShardsPartitioner(2),
        token=TOKEN,
        rpc_timeout=120,
    )
    rows = mib * (1 << 20) // 4 // 1024
    nbytes = rows * 1024 * 4
    with strategy.scope():
        v = Variable(np.zeros((rows, 1024), np.float32), name="big")
        opt = SGD(1e-3)
    grad = np.ones((rows, 1024), np.float32)
    ops = {
        "pull": lambda: np.asarray(v),
        "push": lambda: strategy.extended.push_gradients(opt, [(grad, v)]),
        "assign": lambda: v.assign(grad),
    }
    seconds: dict[str, list[float]] = {name: [] for name in ["tcp", "fresh", *ops]}
    for r in range(repeats + 1):
        timings = {"tcp": nbytes / loopback_tcp_bandwidth(nbytes)}
        start = time.perf_counter()
        np.ones(nbytes // 4, np.float32)  # what allocating and first writing an array costs
        timings["fresh"] = time.perf_counter() - start
        for name, fn in ops.items():
            start = time.perf_counter()
            fn()
            timings[name] = time.perf_counter() - start
        if r > 0:  # round 0 warms up connections and buffers
            for name, t in timings.items():
                seconds[name].append(t)
    out = {f"{name}_GBps": nbytes / float(np.median(t)) / 1e9 for name, t in seconds.items()}
    for name in ops:
        out[f"{name}_x_tcp"] = float(
            np.median([tcp / t for tcp, t in zip(seconds["tcp"], seconds[name])])
        )
    return out


def plot_scaling(results: dict, path: str, command: str) -> None:
    """Async steps per second by number of workers (2 ps tasks), the numpy loop of the same run
    as a reference line; footer: machine, date, command."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pycollective.bench.report import machine_label

    counts = sorted(int(n) for n in results["async_steps_per_s_by_workers"])
    sps = [results["async_steps_per_s_by_workers"][str(n)] for n in counts]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(counts, sps, marker="o", label="ParameterServerStrategy, async (2 ps tasks)")
    for n, value in zip(counts, sps):
        ax.annotate(
            f"{value:.0f}",
            (n, value),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=8,
        )
    ax.axhline(95, color="grey", linestyle=":", label="TensorFlow PSS, 2 ps + 2 workers (issue 19)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_ylim(0, max(sps) * 1.25)
    ax.set_xlabel("workers")
    ax.set_ylabel("training steps per second")
    ax.set_title(
        f"digits softmax regression, batch {results['batch']}: async steps/s by workers "
        f"(numpy loop: {results['numpy_steps_per_s']:.0f})",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.text(0.01, 0.01, machine_label() + f"\n$ {command}", fontsize=6, color="dimgrey")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="size of the sharded variable")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved transfer rounds")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--workers", default="1,2,4,8", help="worker counts of the async runs (comma-separated)"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--plot", default=None, help="draw async steps/s by workers here (PNG)")
    args = parser.parse_args(argv)
    counts = sorted({int(n) for n in args.workers.split(",")} | {2})

    tasks = [Task("ps", 0), Task("ps", 1)]
    try:
        tasks += [Task("worker", i) for i in range(max(counts))]
        ps = [tasks[0].address, tasks[1].address]
        workers = [t.address for t in tasks[2:]]

        def cluster(n: int) -> dict:
            return {"chief": ["127.0.0.1:1"], "ps": ps, "worker": workers[:n]}

        results: dict = {"variable_mib": args.mib, "shards": 2, "ps_tasks": 2}
        results.update(transfer_rounds(cluster(2), args.mib, args.repeats))
        x, y = load_digits_data()
        numpy_sps = numpy_steps_per_second(x, y, args.steps * 5, args.batch)
        by_workers = {}
        for n in counts:
            by_workers[str(n)] = cluster_steps_per_second(
                cluster(n), "async", x, y, args.steps, args.batch
            )
        sync_sps = cluster_steps_per_second(cluster(2), "sync", x, y, args.steps, args.batch)
        numpy_after = numpy_steps_per_second(x, y, args.steps * 5, args.batch)
    finally:
        for t in tasks:
            t.stop()

    results.update(
        {
            "numpy_steps_per_s": float(np.median([numpy_sps, numpy_after])),
            "async_steps_per_s": by_workers["2"],
            "async_steps_per_s_by_workers": by_workers,
            "sync_steps_per_s": sync_sps,
            "sync_ms_per_update": 2 / sync_sps * 1e3,
            "batch": args.batch,
            "cpus": os.cpu_count(),
        }
    )
    print(
        f"{args.mib} MiB variable, 2 shards on 2 ps tasks, median of {args.repeats} rounds, each "
        "beside a loopback TCP stream of the same size:"
    )
    print(f"  loopback TCP stream  {results['tcp_GBps']:6.2f} GB/s")
    print(f"  new array (alloc + fill) {results['fresh_GBps']:6.2f} GB/s  (a pull returns one)")
    for name in ("pull", "push", "assign"):
        print(
            f"  {name:6s} {results[f'{name}_GBps']:6.2f} GB/s = "
            f"{results[f'{name}_x_tcp']:5.2f} x loopback TCP"
        )
    numpy_sps = results["numpy_steps_per_s"]
    print(f"digits softmax regression, batch {args.batch}, 2 ps tasks:")
    print(f"  bare numpy loop (1 process)  {numpy_sps:8.0f} steps/s")
    for n in counts:
        sps = by_workers[str(n)]
        print(
            f"  async, {n} worker{'s' if n > 1 else ' '}            {sps:8.0f} steps/s = "
            f"{sps / numpy_sps:.4f} x numpy"
        )
    print(
        f"  sync, 2 workers              {sync_sps:8.0f} steps/s = "
        f"{sync_sps / numpy_sps:.4f} x numpy ({results['sync_ms_per_update']:.2f} ms per "
        "synchronous update of 2 steps)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        command = "pycollective bench-ps " + " ".join(sys.argv[1:] if argv is None else argv)
        plot_scaling(results, args.plot, command)
    return results


if __name__ == "__main__":
    main()
