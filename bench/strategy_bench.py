"""Is the strategy layer thin? Synchronizing 16 MiB of gradients per step through
``optimizer.apply_gradients`` against a bare allreduce of the same bytes, in the same run:

    python -m bench.strategy_bench                      # 4 CPU replicas (MirroredStrategy)
    pycollective run -n 2 python -m bench.strategy_bench --multi-worker

The optimizer step includes the update arithmetic (SGD: one multiply-add over the variables;
``--momentum 0.9``: momentum SGD, which also reads and writes a slot), so the ratio measures the
strategy's overhead plus the work an optimizer must do anyway. The two are timed alternately,
step by step, and the medians compared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _side_by_side(a, b, iters: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, sampled alternately (a, b, a, b, ...) so that the
    machine's noise hits both alike."""
    a()
    b()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(iters):
        for fn, out in ((a, samples[0]), (b, samples[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(samples[0]), statistics.median(samples[1])


def main(argv: list[str] | None = None) -> int:
    import pycollective as pc
    from pycollective.strategies import (
        SGD,
        MirroredStrategy,
        MultiWorkerMirroredStrategy,
        Variable,
    )

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--variables", type=int, default=8, help="gradient tensors per step")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0: plain SGD)")
    p.add_argument("--multi-worker", action="store_true")
    args = p.parse_args(argv)

    count = args.mib * (1 << 20) // 4 // args.variables
    if args.multi_worker:
        strategy = MultiWorkerMirroredStrategy()
        bare = lambda: pc.allreduce(flat, out=out)  # noqa: E731
        flat = np.ones(count * args.variables, np.float32)
        out = np.empty_like(flat)
    else:
        strategy = MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
        comm = pc.LocalCommunicator(args.replicas)
        flats = [np.ones(count * args.variables, np.float32) for _ in range(args.replicas)]
        outs = [np.empty_like(f) for f in flats]
        bare = lambda: comm.allreduce(flats, out=outs)  # noqa: E731
    with strategy.scope():
        variables = [Variable(np.zeros(count, np.float32)) for _ in range(args.variables)]
        opt = SGD(learning_rate=0.01, momentum=args.momentum)
    grads = [np.ones(count, np.float32) for _ in range(args.variables)]

    def step():
        def replica_fn():
            opt.apply_gradients(zip(grads, variables))

        strategy.run(replica_fn)

    t_bare, t_step = _side_by_side(bare, step, args.iters)
    where = "2 workers" if args.multi_worker else f"{args.replicas} CPU replicas"
    if not args.multi_worker or pc.rank() == 0:
        rule = f"SGD with momentum {args.momentum}" if args.momentum else "plain SGD"
        print(
            f"{args.mib} MiB of gradients in {args.variables} tensors, {where}, {rule}: "
            f"bare allreduce "
            f"{t_bare * 1e3:.1f} ms, apply_gradients step {t_step * 1e3:.1f} ms, ratio "
            f"{t_step / t_bare:.2f}x"
        )
    if args.multi_worker:
        pc.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
