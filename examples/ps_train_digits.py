"""Train on scikit-learn's digits with ParameterServerStrategy: parameter servers hold the
variables and the optimizer state, workers compute gradients, this program coordinates.

    # a whole cluster on this machine: 2 ps tasks, 2 workers, this program as the chief
    pycollective run --ps 2 --workers 2 python examples/ps_train_digits.py
    pycollective run --ps 2 --workers 2 python examples/ps_train_digits.py --update-mode sync

    # checkpointing on: a ps task that dies is restarted by the launcher and restored by the
    # coordinator from the last checkpoint; the training goes on (async only)
    pycollective run --ps 2 --workers 2 --max-restarts 3 python examples/ps_train_digits.py \
        --checkpoint-dir /tmp/ps_ckpt

    # no cluster (no TF_CONFIG): one machine, variables in host memory, local replicas
    python examples/ps_train_digits.py --replicas 2

In a cluster every worker builds its own input pipeline (create_per_worker_dataset: a shuffled,
endless stream of batches from its share of the training set) and the coordinator schedules
one training step per batch on whichever worker is free. ``--update-mode async`` applies each
worker's gradients on arrival; ``--update-mode sync`` makes each parameter server wait for one
gradient from every worker, average them and apply them once per step. After every epoch the
coordinator reads the variables and evaluates the model on the test set.

Functions and classes of this script travel to the workers by value, which needs cloudpickle
(``pip install cloudpickle``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# The data and the models are the ones the MirroredStrategy example trains (same folder).
import train_digits  # noqa: E402
from train_digits import MLP, SoftmaxRegression, load_data, softmax_cross_entropy  # noqa: E402

from pycollective.strategies import (
    SGD,
    Adam,
    Checkpoint,
    ClusterCoordinator,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    ReduceOp,
)

try:  # workers cannot import this folder's modules: send the models by value, like __main__
    import cloudpickle

    cloudpickle.register_pickle_by_value(train_digits)
except ImportError:
    pass


def evaluate(model, x, y):
    """Test loss and accuracy, computed on the coordinator (it reads the variables)."""
    logits = model.logits(x)
    losses, _ = softmax_cross_entropy(logits, y)
    return float(losses.mean()), float((logits.argmax(axis=1) == y).mean())


def build(args, n_in):
    model = (
        SoftmaxRegression(n_in, 10)
        if args.model == "softmax"
        else MLP(n_in, 64, 10, seed=args.seed)
    )
    if args.optimizer == "adam" or (args.optimizer is None and args.model == "mlp"):
        optimizer = Adam(0.01, gradient_aggregation=ReduceOp.SUM)
    else:
        optimizer = SGD(0.2, momentum=0.9, gradient_aggregation=ReduceOp.SUM)
    return model, optimizer


def train_cluster(strategy, args, train, test) -> float:
    coordinator = ClusterCoordinator(strategy)
    num_workers = len(strategy.extended.worker_tasks)
    (x_train, y_train), (x_test, y_test) = train, test
    with strategy.scope():
        model, optimizer = build(args, x_train.shape[1])
    if args.checkpoint_dir:
        coordinator.enable_checkpointing(
            Checkpoint(model=model, optimizer=optimizer),
            args.checkpoint_dir,
            every_functions=args.checkpoint_every,
        )
    batch_size, seed = args.batch_size, args.seed

    def dataset_fn(input_context):
        # Runs on each worker: its share of the training set, reshuffled every pass, forever.
        index = input_context.input_pipeline_id
        x = x_train[index :: input_context.num_input_pipelines]
        y = y_train[index :: input_context.num_input_pipelines]
        rng = np.random.default_rng(seed + index)
        while True:
            order = rng.permutation(len(x))
            for i in range(0, len(x) - batch_size + 1, batch_size):
                rows = order[i : i + batch_size]
                yield x[rows], y[rows]

    def train_step(iterator):
        x, y = next(iterator)
        # Sync mode averages the workers' gradients (SUM / number of workers would not).
        scale = len(y) * strategy.num_replicas_in_sync
        loss_sum, grads = model.loss_and_gradients(x, y, scale=scale)
        optimizer.apply_gradients(zip(grads, model.variables))
        return loss_sum / len(y)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    steps = max(num_workers, len(x_train) // batch_size // num_workers * num_workers)
    print(
        f"ParameterServerStrategy: {len(strategy.extended.ps_tasks)} ps, {num_workers} "
        f"workers, {args.update_mode} updates, model {args.model}, {steps} steps of "
        f"{batch_size} per epoch",
        flush=True,
    )
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        losses = [
            coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(steps)
        ]
        coordinator.join()
        train_loss = float(np.mean([rv.fetch() for rv in losses]))
        elapsed = time.perf_counter() - start
        test_loss, accuracy = evaluate(model, x_test, y_test)
        print(
            f"epoch {epoch:3d}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
            f"test accuracy {accuracy:.4f}  ({steps / elapsed:.0f} steps/s, "
            f"{int(optimizer.iterations.read_value())} updates)",
            flush=True,
        )
    for recovery in coordinator.recoveries:
        print(
            f"recovered from the loss of {recovery.task}: restored {recovery.checkpoint}, "
            f"{recovery.replayed} step(s) run again, {recovery.seconds:.2f} s",
            flush=True,
        )
    coordinator.close()
    print(f"final test accuracy {accuracy:.4f}", flush=True)
    return accuracy


def train_one_machine(strategy, args, train, test) -> float:
    (x_train, y_train), (x_test, y_test) = train, test
    with strategy.scope():
        model, optimizer = build(args, x_train.shape[1])

    def replica_step(batch, global_batch_size):
        x, y = batch
        loss_sum, grads = model.loss_and_gradients(x, y, scale=global_batch_size)
        optimizer.apply_gradients(zip(grads, model.variables))  # reduced to the parameter device
        return np.float64(loss_sum)

    print(
        f"ParameterServerStrategy on one machine: {strategy.num_replicas_in_sync} replicas, "
        f"variables on {strategy.extended.parameter_devices[0]}, model {args.model}",
        flush=True,
    )
    rng = np.random.default_rng(args.seed)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = rng.permutation(len(x_train))
        batches = [
            (x_train[order[i : i + args.batch_size]], y_train[order[i : i + args.batch_size]])
            for i in range(0, len(x_train), args.batch_size)
        ]
        total = 0.0
        for (gx, _), batch in zip(batches, strategy.experimental_distribute_dataset(batches)):
            per_replica = strategy.run(replica_step, args=(batch, len(gx)))
            total += float(strategy.reduce(ReduceOp.SUM, per_replica, axis=None))
        test_loss, accuracy = evaluate(model, x_test, y_test)
        print(
            f"epoch {epoch:3d}  train loss {total / len(x_train):.4f}  test loss "
            f"{test_loss:.4f}  test accuracy {accuracy:.4f}  "
            f"({time.perf_counter() - start:.2f} s)",
            flush=True,
        )
    print(f"final test accuracy {accuracy:.4f}", flush=True)
    return accuracy


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update-mode", choices=["async", "sync"], default="async")
    parser.add_argument("--model", choices=["softmax", "mlp"], default="softmax")
    parser.add_argument(
        "--optimizer",
        choices=["sgd", "adam"],
        default=None,
        help="default: sgd (momentum 0.9) for softmax, adam for mlp",
    )
    parser.add_argument(
        "--shards", type=int, default=2, help="partition the weight matrices into this many shards"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per step")
    parser.add_argument(
        "--replicas", type=int, default=2, help="local replicas when there is no cluster"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="cluster, async: checkpoint there and recover from a lost ps task "
        "(ClusterCoordinator.enable_checkpointing)",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=50, help="steps between checkpoints"
    )
    args = parser.parse_args(argv)
    partitioner = FixedShardsPartitioner(args.shards) if args.shards > 1 else None
    strategy = ParameterServerStrategy(
        variable_partitioner=partitioner,
        update_mode=args.update_mode,
        compute_devices=[f"/cpu:{i}" for i in range(args.replicas)],
    )
    train, test = load_data(args.seed)
    if strategy.is_cluster:
        return train_cluster(strategy, args, train, test)
    return train_one_machine(strategy, args, train, test)


if __name__ == "__main__":
    main()
