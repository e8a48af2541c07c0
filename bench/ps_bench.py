"""ParameterServerStrategy benchmark: pull/push throughput and training steps per second.

    python -m bench.ps_bench                 # from the repo root
    python -m bench.ps_bench --mib 64 --steps 300 --json out.json

Starts 2 ps tasks and 2 worker tasks as processes on this machine (OS-chosen ports), then
measures, in the same run:

- pull / push / assign throughput of one ``--mib`` MiB float32 variable split into 2 shards (one
  per ps task), from the coordinator: pull = read the whole variable, push = gradients of the
  whole variable applied with SGD on the parameter servers, assign = overwrite it. Reported in
  GB/s and as a fraction of one loopback TCP stream's bandwidth (bench.ceilings), measured in the
  same run: a ratio, not an absolute, carries the result.
- steps per second of the digits softmax-regression model (batch 32, SGD) trained on the 2
  workers, asynchronously and synchronously, against the same model in a bare single-process
  numpy loop (no strategy, no network).

Each throughput is the median of ``--repeats`` timed calls after one warm-up call.
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
    """A ps or worker process on an OS-chosen port."""

    def __init__(self, job: str, index: int) -> None:
        env = dict(
            child_environment(),
            PYCOLLECTIVE_TOKEN=TOKEN,
            PYTHONUNBUFFERED="1",
            TF_CONFIG=json.dumps(
                {
                    "cluster": {job: ["127.0.0.1:0"] * (index + 1)},
                    "task": {"type": job, "index": index},
                }
            ),
        )
        self.process = subprocess.Popen(
            python_module_command("pycollective.strategies.parameter_server"),
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
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (connections, page faults)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


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

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(20):  # warm-up: iterators, connections
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    start = time.perf_counter()
    for _ in range(steps):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    elapsed = time.perf_counter() - start
    coordinator.close()
    return steps / elapsed


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="size of the sharded variable")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="training steps per mode")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)

    tasks = [Task("ps", 0), Task("ps", 1), Task("worker", 0), Task("worker", 1)]
    try:
        cluster = {
            "chief": ["127.0.0.1:1"],
            "ps": [tasks[0].address, tasks[1].address],
            "worker": [tasks[2].address, tasks[3].address],
        }
        tcp = loopback_tcp_bandwidth()
        # A pull returns a new array: what allocating and first writing one costs here.
        fresh = median_seconds(lambda: np.ones(args.mib << 18, np.float32), args.repeats)
        strategy = ParameterServerStrategy(
            SimpleClusterResolver(cluster, task_type="chief", task_id=0),
            variable_partitioner=FixedShardsPartitioner(2),
            token=TOKEN,
            rpc_timeout=120,
        )
        rows = args.mib * (1 << 20) // 4 // 1024
        nbytes = rows * 1024 * 4
        with strategy.scope():
            v = Variable(np.zeros((rows, 1024), np.float32), name="big")
            opt = SGD(1e-3)
        grad = np.ones((rows, 1024), np.float32)
        pull = median_seconds(lambda: np.asarray(v), args.repeats)
        push = median_seconds(
            lambda: strategy.extended.push_gradients(opt, [(grad, v)]), args.repeats
        )
        assign = median_seconds(lambda: v.assign(grad), args.repeats)
        x, y = load_digits_data()
        numpy_sps = numpy_steps_per_second(x, y, args.steps * 5, args.batch)
        async_sps = cluster_steps_per_second(cluster, "async", x, y, args.steps, args.batch)
        sync_sps = cluster_steps_per_second(cluster, "sync", x, y, args.steps, args.batch)
    finally:
        for t in tasks:
            t.stop()

    results = {
        "variable_mib": args.mib,
        "shards": 2,
        "ps_tasks": 2,
        "loopback_tcp_GBps": tcp / 1e9,
        "fresh_array_GBps": nbytes / fresh / 1e9,
        "pull_GBps": nbytes / pull / 1e9,
        "push_GBps": nbytes / push / 1e9,
        "assign_GBps": nbytes / assign / 1e9,
        "numpy_steps_per_s": numpy_sps,
        "async_steps_per_s": async_sps,
        "sync_steps_per_s": sync_sps,
        "batch": args.batch,
        "cpus": os.cpu_count(),
    }
    print(f"one loopback TCP stream: {tcp / 1e9:.2f} GB/s")
    print(
        f"allocating + filling a new {args.mib} MiB array: {nbytes / fresh / 1e9:.2f} GB/s "
        "(a pull returns a new array)"
    )
    print(f"{args.mib} MiB variable, 2 shards on 2 ps tasks (median of {args.repeats}):")
    for name in ("pull", "push", "assign"):
        gbps = results[f"{name}_GBps"]
        print(f"  {name:6s} {gbps:6.2f} GB/s  = {gbps * 1e9 / tcp:5.2f} x loopback TCP")
    print(f"digits softmax regression, batch {args.batch}, 2 workers:")
    print(f"  bare numpy loop (1 process)  {numpy_sps:8.0f} steps/s")
    for mode in ("async", "sync"):
        sps = results[f"{mode}_steps_per_s"]
        print(
            f"  ParameterServerStrategy {mode:5s} {sps:8.0f} steps/s = "
            f"{sps / numpy_sps:.3f} x numpy"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
