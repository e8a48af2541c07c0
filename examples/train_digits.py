"""Train on scikit-learn's digits with MirroredStrategy: softmax regression or a small MLP,
in numpy with the gradients written out.

    python examples/train_digits.py                         # softmax regression, 4 replicas
    python examples/train_digits.py --model mlp --replicas 2 --epochs 20
    pycollective run -n 2 python examples/train_digits.py --multi-worker
    pycollective run -n 2 python examples/train_digits.py --multi-worker --compress bf16 \
        --error-feedback                                    # 16-bit gradients between workers
    srun -n 2 python examples/train_digits.py --multi-worker        # or mpirun -n 2 ...

Each step, a global batch is split across the replicas; every replica computes the gradients
of its share of the loss (per-example losses summed and divided by the *global* batch size,
tf.distribute's convention), the optimizer all-reduces them (SUM, fused into one collective)
and every replica applies the same update. So the parameters after each step equal those of
one replica training on the whole global batch, however the batch was split, including the
uneven last batch of an epoch.

Evaluation is distributed too: every replica counts its correct predictions and losses in
sync-on-read variables (no communication while counting); reading them afterwards sums over
all replicas.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import pycollective
from pycollective.strategies import (
    SGD,
    Adam,
    CommunicationOptions,
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    ReduceOp,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)


def load_data(seed: int = 0, test_fraction: float = 0.2):
    """The 1797 8x8 digits as float32 features in [0, 1], split into train and test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def batches(x, y, batch_size, rng=None):
    order = rng.permutation(len(x)) if rng is not None else np.arange(len(x))
    return [
        (x[order[i : i + batch_size]], y[order[i : i + batch_size]])
        for i in range(0, len(x), batch_size)
    ]


def softmax_cross_entropy(logits, labels):
    """Per-example losses and d(loss)/d(logits)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    losses = -np.log(probs[rows, labels] + 1e-12)
    dlogits = probs
    dlogits[rows, labels] -= 1.0
    return losses, dlogits


class SoftmaxRegression:
    def __init__(self, n_in: int, n_out: int) -> None:
        self.w = Variable(np.zeros((n_in, n_out), np.float32), name="w")
        self.b = Variable(np.zeros(n_out, np.float32), name="b")

    @property
    def variables(self):
        return [self.w, self.b]

    def logits(self, x):
        return x @ np.asarray(self.w) + np.asarray(self.b)

    def loss_and_gradients(self, x, y, scale):
        losses, dlogits = softmax_cross_entropy(self.logits(x), y)
        d = (dlogits / scale).astype(np.float32)
        return losses.sum(), [x.T @ d, d.sum(axis=0)]


class MLP:
    def __init__(self, n_in: int, n_hidden: int, n_out: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        he = np.sqrt(2.0 / n_in)
        self.w1 = Variable((he * rng.normal(size=(n_in, n_hidden))).astype(np.float32), name="w1")
        self.b1 = Variable(np.zeros(n_hidden, np.float32), name="b1")
        self.w2 = Variable(
            (rng.normal(size=(n_hidden, n_out)) / np.sqrt(n_hidden)).astype(np.float32), name="w2"
        )
        self.b2 = Variable(np.zeros(n_out, np.float32), name="b2")

    @property
    def variables(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def _forward(self, x):
        pre = x @ np.asarray(self.w1) + np.asarray(self.b1)
        hidden = np.maximum(pre, 0.0)
        return pre, hidden, hidden @ np.asarray(self.w2) + np.asarray(self.b2)

    def logits(self, x):
        return self._forward(x)[2]

    def loss_and_gradients(self, x, y, scale):
        pre, hidden, logits = self._forward(x)
        losses, dlogits = softmax_cross_entropy(logits, y)
        d2 = (dlogits / scale).astype(np.float32)
        dhidden = (d2 @ np.asarray(self.w2).T) * (pre > 0)
        return losses.sum(), [x.T @ dhidden, dhidden.sum(axis=0), hidden.T @ d2, d2.sum(axis=0)]


class Metrics:
    """Sync-on-read counters: each replica adds to its own copy; reads sum all replicas."""

    def __init__(self) -> None:
        def counter(name):
            return Variable(
                0.0,
                name=name,
                synchronization=VariableSynchronization.ON_READ,
                aggregation=VariableAggregation.SUM,
            )

        self.loss_sum = counter("loss_sum")
        self.correct = counter("correct")
        self.count = counter("count")

    def reset(self) -> None:
        for v in (self.loss_sum, self.correct, self.count):
            v.assign(0.0)

    def result(self):
        count = float(self.count.read_value())
        return float(self.loss_sum.read_value()) / count, float(self.correct.read_value()) / count


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["softmax", "mlp"], default="softmax")
    parser.add_argument("--replicas", type=int, default=4, help="CPU replicas (MirroredStrategy)")
    parser.add_argument(
        "--multi-worker",
        action="store_true",
        help="MultiWorkerMirroredStrategy (launch with pycollective run -n N)",
    )
    parser.add_argument(
        "--compress",
        choices=["bf16", "fp16"],
        default=None,
        help="with --multi-worker: gradients cross the network as 16-bit values",
    )
    parser.add_argument(
        "--error-feedback",
        action="store_true",
        help="with --compress: carry each step's rounding residue into the next step",
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument(
        "--optimizer",
        choices=["sgd", "adam"],
        default=None,
        help="default: sgd (momentum 0.9) for softmax, adam for mlp",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.multi_worker:
        if not os.environ.get("TF_CONFIG"):
            # srun, mpirun, torchrun or a PyTorchJob: join the group their environment
            # describes; the strategy then runs on it (docs/launching.md).
            pycollective.init()
        strategy = MultiWorkerMirroredStrategy(
            communication_options=CommunicationOptions(
                compress=args.compress, error_feedback=args.error_feedback
            )
        )
    elif args.compress:
        parser.error("--compress applies to --multi-worker (replicas in one process send nothing)")
    else:
        strategy = MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    chief = strategy.extended.should_checkpoint
    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    optimizer_name = args.optimizer or ("sgd" if args.model == "softmax" else "adam")
    with strategy.scope():
        if args.model == "softmax":
            model = SoftmaxRegression(x_train.shape[1], 10)
        else:
            model = MLP(x_train.shape[1], 64, 10, seed=args.seed)
        if optimizer_name == "sgd":
            optimizer = SGD(0.2, momentum=0.9, gradient_aggregation=ReduceOp.SUM)
        else:
            optimizer = Adam(0.01, gradient_aggregation=ReduceOp.SUM)
        metrics = Metrics()

    def train_step(batch, global_batch_size):
        x, y = batch
        loss_sum, grads = model.loss_and_gradients(x, y, scale=global_batch_size)
        optimizer.apply_gradients(zip(grads, model.variables))
        return np.float64(loss_sum)

    def eval_step(batch):
        x, y = batch
        logits = model.logits(x)
        losses, _ = softmax_cross_entropy(logits, y)
        metrics.loss_sum.assign_add(float(losses.sum()))
        metrics.correct.assign_add(float((logits.argmax(axis=1) == y).sum()))
        metrics.count.assign_add(float(len(y)))

    test_data = strategy.experimental_distribute_dataset(batches(x_test, y_test, 256))
    if chief:
        print(
            f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas, model "
            f"{args.model}, optimizer {optimizer_name}, global batch {args.batch_size}, "
            f"{len(x_train)} train / {len(x_test)} test examples",
            flush=True,
        )
    rng = np.random.default_rng(args.seed)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        global_batches = batches(x_train, y_train, args.batch_size, rng)
        total_loss = 0.0
        for (gx, _), batch in zip(
            global_batches, strategy.experimental_distribute_dataset(global_batches)
        ):
            per_replica_loss = strategy.run(train_step, args=(batch, len(gx)))
            total_loss += float(strategy.reduce(ReduceOp.SUM, per_replica_loss, axis=None))
        metrics.reset()
        for batch in test_data:
            strategy.run(eval_step, args=(batch,))
        test_loss, accuracy = metrics.result()
        if chief:
            print(
                f"epoch {epoch:3d}  train loss {total_loss / len(x_train):.4f}  "
                f"test loss {test_loss:.4f}  test accuracy {accuracy:.4f}  "
                f"({time.perf_counter() - start:.2f} s)",
                flush=True,
            )
    if chief:
        print(f"final test accuracy {accuracy:.4f}", flush=True)
    if args.multi_worker:
        pycollective.shutdown()  # leave the process group together
    return accuracy


if __name__ == "__main__":
    main()
