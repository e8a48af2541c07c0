"""Train an MLP on scikit-learn's digits with TPUStrategy: the training step is compiled by XLA
(through JAX) into one SPMD program for all replicas, gradient all-reduce included.

    python examples/train_digits_tpu.py                       # 4 forced CPU devices
    python examples/train_digits_tpu.py --cpu-devices 8 --steps-per-execution 5
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        pycollective run -n 2 python examples/train_digits_tpu.py --cpu-devices 0
    python examples/train_digits_tpu.py --cpu-devices 0       # on a TPU VM / GPU host: all

Each replica computes the gradient of its share of the loss: per-example losses, masked where
``experimental_distribute_dataset`` padded an uneven batch (``experimental_valid_rows``),
summed and divided by the *global* batch size (the sum of every replica's valid rows, one
more all-reduce inside the step); the optimizer sums them across replicas
(``gradient_aggregation="SUM"``). So every step equals one device on the whole global batch,
the uneven last batch of an epoch included. Evaluation counts correct predictions in
sync-on-read variables (each replica its own copy; reading sums them).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from train_digits import load_data  # the same split as the other examples


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=4,
        help="host CPU devices to force when JAX runs on the CPU (0: leave JAX's "
        "choice, e.g. TPU cores, GPUs or XLA_FLAGS)",
    )
    p.add_argument("--replicas", type=int, default=None, help="use the first N devices")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--steps-per-execution", type=int, default=1)
    args = p.parse_args(argv)

    import jax

    if args.cpu_devices:
        try:  # only possible before JAX has started its backends
            jax.config.update("jax_num_cpu_devices", args.cpu_devices)
        except RuntimeError:
            pass
    import jax.numpy as jnp

    from pycollective.strategies import (
        Adam,
        TPUStrategy,
        Variable,
        get_replica_context,
    )

    strategy = TPUStrategy(
        experimental_device_assignment=args.replicas, steps_per_execution=args.steps_per_execution
    )
    print(
        f"TPUStrategy: {strategy.num_replicas_in_sync} replicas on "
        f"{strategy.cluster_resolver.platform} devices",
        flush=True,
    )
    (x_train, y_train), (x_test, y_test) = load_data()
    # int32 labels: JAX keeps 64-bit integers off by default.
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
    rng = np.random.default_rng(1)
    with strategy.scope():
        params = {
            "w1": Variable(
                (rng.normal(size=(64, args.hidden)) * 0.1).astype(np.float32), name="w1"
            ),
            "b1": Variable(np.zeros(args.hidden, np.float32), name="b1"),
            "w2": Variable(
                (rng.normal(size=(args.hidden, 10)) * 0.1).astype(np.float32), name="w2"
            ),
            "b2": Variable(np.zeros(10, np.float32), name="b2"),
        }
        optimizer = Adam(args.learning_rate, gradient_aggregation="SUM")
        optimizer.build(params.values())  # slots now: the step compiles once
        correct = Variable(
            0.0, synchronization="ON_READ", aggregation="SUM", trainable=False, name="correct"
        )

    def logits_of(p, x):
        return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    def masked_losses(p, x, y):
        mask = jnp.arange(x.shape[0]) < get_replica_context().experimental_valid_rows
        logp = jax.nn.log_softmax(logits_of(p, x))
        nll = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return jnp.where(mask, nll, 0.0)

    def train_step(batch):
        x, y = batch
        ctx = get_replica_context()
        global_size = ctx.all_reduce("SUM", ctx.experimental_valid_rows).astype(jnp.float32)
        values = {k: v.value() for k, v in params.items()}
        loss, grads = jax.value_and_grad(lambda p: jnp.sum(masked_losses(p, x, y)) / global_size)(
            values
        )
        optimizer.apply_gradients((grads[k], params[k]) for k in sorted(params))
        return ctx.all_reduce("SUM", loss)  # the global batch's mean loss

    def eval_step(x, y):
        mask = jnp.arange(x.shape[0]) < get_replica_context().experimental_valid_rows
        hits = (
            jnp.argmax(logits_of({k: v.value() for k, v in params.items()}, x), axis=1) == y
        ) & mask
        correct.assign_add(jnp.sum(hits.astype(jnp.float32)))

    def evaluate() -> float:
        correct.assign(0.0)
        for x, y in strategy.experimental_distribute_dataset(
            [(x_test[i : i + 128], y_test[i : i + 128]) for i in range(0, len(x_test), 128)]
        ):
            strategy.run(eval_step, args=(x, y))
        return float(correct.numpy()) / len(x_test)

    order_rng = np.random.default_rng(2)
    for epoch in range(1, args.epochs + 1):
        order = order_rng.permutation(len(x_train))
        batches = [
            (x_train[order[i : i + args.batch_size]], y_train[order[i : i + args.batch_size]])
            for i in range(0, len(x_train), args.batch_size)
        ]
        start = time.perf_counter()
        iterator = iter(strategy.experimental_distribute_dataset(batches))
        losses = []
        while True:
            loss = strategy.run_steps(train_step, iterator)
            if loss is None:
                break
            losses.append(float(strategy.experimental_local_results(loss)[0]))
        print(
            f"epoch {epoch:3d}  train loss {np.mean(losses):.4f}  "
            f"test accuracy {evaluate():.4f}  ({time.perf_counter() - start:.2f} s)",
            flush=True,
        )
    accuracy = evaluate()
    print(f"final test accuracy {accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
