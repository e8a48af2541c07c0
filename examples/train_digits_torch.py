"""The digits MLP with PyTorch autograd inside MirroredStrategy replicas.

    python examples/train_digits_torch.py --replicas 4 --epochs 10

The parameters are pycollective.strategies Variables (one numpy copy per replica). Inside each
replica, ``torch.from_numpy`` views that replica's copy without copying; torch computes the
loss and its gradients, and the strategy-aware optimizer all-reduces the torch gradients and
updates every copy in place. Evaluation sums sync-on-read counters across replicas.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from train_digits import batches, load_data

from pycollective.strategies import (
    Adam,
    MirroredStrategy,
    ReduceOp,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the replicas are the parallelism

    strategy = MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    with strategy.scope():
        params = [
            Variable(torch.randn(64, args.hidden, generator=gen) * (2 / 64) ** 0.5, name="w1"),
            Variable(torch.zeros(args.hidden), name="b1"),
            Variable(torch.randn(args.hidden, 10, generator=gen) / args.hidden**0.5, name="w2"),
            Variable(torch.zeros(10), name="b2"),
        ]
        optimizer = Adam(0.01, gradient_aggregation=ReduceOp.SUM)
        correct, count = (
            Variable(
                0.0,
                name=n,
                synchronization=VariableSynchronization.ON_READ,
                aggregation=VariableAggregation.SUM,
            )
            for n in ("correct", "count")
        )

    def forward(x, weights):
        w1, b1, w2, b2 = weights
        return F.relu(x @ w1 + b1) @ w2 + b2

    def replica_weights(requires_grad):
        # This replica's copies, viewed (not copied) as torch tensors.
        return [torch.from_numpy(np.asarray(p)).requires_grad_(requires_grad) for p in params]

    def train_step(batch, global_batch_size):
        x, y = (torch.from_numpy(a) for a in batch)
        weights = replica_weights(True)
        loss = F.cross_entropy(forward(x, weights), y, reduction="sum") / global_batch_size
        loss.backward()
        optimizer.apply_gradients(zip([w.grad for w in weights], params))
        return loss.detach() * global_batch_size

    def eval_step(batch):
        x, y = (torch.from_numpy(a) for a in batch)
        with torch.no_grad():
            predictions = forward(x, replica_weights(False)).argmax(dim=1)
        correct.assign_add(float((predictions == y).sum()))
        count.assign_add(float(len(y)))

    print(
        f"MirroredStrategy: {strategy.num_replicas_in_sync} replicas, torch "
        f"{torch.__version__}, MLP 64-{args.hidden}-10, Adam",
        flush=True,
    )
    rng = np.random.default_rng(args.seed)
    test_data = strategy.experimental_distribute_dataset(batches(x_test, y_test, 256))
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        global_batches = batches(x_train, y_train, args.batch_size, rng)
        total = 0.0
        for (gx, _), batch in zip(
            global_batches, strategy.experimental_distribute_dataset(global_batches)
        ):
            total += float(
                strategy.reduce(
                    ReduceOp.SUM, strategy.run(train_step, args=(batch, len(gx))), axis=None
                )
            )
        correct.assign(0.0)
        count.assign(0.0)
        for batch in test_data:
            strategy.run(eval_step, args=(batch,))
        accuracy = float(correct.read_value()) / float(count.read_value())
        print(
            f"epoch {epoch:3d}  train loss {total / len(x_train):.4f}  "
            f"test accuracy {accuracy:.4f}  ({time.perf_counter() - start:.2f} s)",
            flush=True,
        )
    print(f"final test accuracy {accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
