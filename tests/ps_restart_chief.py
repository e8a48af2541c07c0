"""The chief (coordinator program) of test_ps_restart.py, run under ``pycollective run --ps 2
--workers 2 --max-restarts 1``: async training of the digits softmax regression with
checkpointing on; at a seeded step it SIGKILLs ps task 1 (the launcher restarts it on its
address) and trains on. It prints one ``RESULT {json}`` line for the test to check.

    python ps_restart_chief.py STEPS SEED CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
import train_digits  # noqa: E402
from cluster_tasks import task_pid  # noqa: E402
from train_digits import SoftmaxRegression, load_data, softmax_cross_entropy  # noqa: E402

from pycollective.strategies import (  # noqa: E402
    SGD,
    Checkpoint,
    ClusterCoordinator,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    ReduceOp,
)

try:  # the workers cannot import examples/: send the model's module by value
    import cloudpickle

    cloudpickle.register_pickle_by_value(train_digits)
except ImportError:  # pragma: no cover - the test skips without cloudpickle
    pass

BATCH, LR, MOMENTUM = 32, 0.2, 0.9


def accuracy_and_loss(w, b, x, y):
    logits = x @ w + b
    losses, _ = softmax_cross_entropy(logits, y)
    return float((logits.argmax(axis=1) == y).mean()), float(losses.mean())


def numpy_reference(train, test, steps, seed):
    """The same model, optimizer and number of steps, uninterrupted, in one numpy loop."""
    (x, y), (x_test, y_test) = train, test
    w = np.zeros((x.shape[1], 10), np.float32)
    b = np.zeros(10, np.float32)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.choice(len(x), BATCH, replace=False)
        _, d = softmax_cross_entropy(x[rows] @ w + b, y[rows])
        d = (d / BATCH).astype(np.float32)
        vw = MOMENTUM * vw - LR * (x[rows].T @ d)
        vb = MOMENTUM * vb - LR * d.sum(axis=0)
        w, b = w + vw, b + vb
    return accuracy_and_loss(w, b, x_test, y_test)


def main() -> None:
    steps, seed, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    train, test = load_data(0)
    (x_train, y_train), (x_test, y_test) = train, test
    strategy = ParameterServerStrategy(
        variable_partitioner=FixedShardsPartitioner(2), rpc_timeout=5.0, closure_timeout=60.0
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        model = SoftmaxRegression(x_train.shape[1], 10)  # w: a shard on each ps task
        optimizer = SGD(LR, momentum=MOMENTUM, gradient_aggregation=ReduceOp.SUM)
    checks = []

    def on_recovery(record):  # before any function runs again: the state is the checkpoint's
        with np.load(record.checkpoint) as saved:
            checks.append(
                {
                    "task": record.task,
                    "restarted": list(record.restarted),
                    "replayed": record.replayed,
                    "seconds": record.seconds,
                    "w_equal": bool(np.array_equal(model.w.read_value(), saved["model/w"])),
                    "b_equal": bool(np.array_equal(model.b.read_value(), saved["model/b"])),
                    "momentum_equal": bool(
                        np.array_equal(
                            optimizer.get_slot(model.w, "momentum").read_value(),
                            saved["optimizer/slots/model/w/momentum"],
                        )
                    ),
                    "iterations": int(optimizer.iterations.read_value()),
                    "saved_iterations": int(saved["optimizer/iterations"]),
                }
            )

    coordinator.enable_checkpointing(
        Checkpoint(model=model, optimizer=optimizer),
        directory,
        every_functions=25,
        restart_timeout=60.0,
        on_recovery=on_recovery,
    )

    def dataset_fn(input_context):
        index = input_context.input_pipeline_id
        rng = np.random.default_rng(seed + 1 + index)
        while True:
            rows = rng.choice(len(x_train), BATCH, replace=False)
            yield x_train[rows], y_train[rows]

    def train_step(iterator):
        x, y = next(iterator)
        loss_sum, grads = model.loss_and_gradients(x, y, scale=len(y))
        optimizer.apply_gradients(zip(grads, model.variables))
        return loss_sum / len(y)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    kill_at = int(np.random.default_rng(seed).integers(steps // 3, 2 * steps // 3))
    killed = {}

    def kill_ps_1(results):
        while sum(r._done for r in results) < kill_at:
            time.sleep(0.01)
        pid = task_pid("ps", 1)
        killed["pid"] = pid
        killed["at"] = sum(r._done for r in results)
        os.kill(pid, signal.SIGKILL)

    results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
    killer = threading.Thread(target=kill_ps_1, args=(results,), daemon=True)
    killer.start()
    coordinator.join()
    killer.join(timeout=10)
    iterations = int(optimizer.iterations.read_value())
    accuracy, loss = accuracy_and_loss(model.w.read_value(), model.b.read_value(), x_test, y_test)
    ref_accuracy, ref_loss = numpy_reference(train, test, steps, seed)
    result = {
        "steps": steps,
        "kill_at": kill_at,
        "killed_at": killed.get("at"),
        "killed_pid": killed.get("pid"),
        "ps1_pid_after": task_pid("ps", 1),
        "iterations": iterations,
        "accuracy": accuracy,
        "loss": loss,
        "reference_accuracy": ref_accuracy,
        "reference_loss": ref_loss,
        "recoveries": checks,
        "train_losses_finite": bool(np.all(np.isfinite([r.fetch() for r in results]))),
        "latest_checkpoint": coordinator.latest_checkpoint,
    }
    coordinator.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
