"""Is the strategy layer thin? Synchronizing 16 MiB of gradients per step through
``optimizer.apply_gradients`` against a bare allreduce of the same bytes, in the same run:

    pycollective bench-strategies                       # 4 CPU replicas (MirroredStrategy)
    pycollective run -n 2 python -m pycollective.bench.strategy_bench --multi-worker
    pycollective run -n 2 python -m pycollective.bench.strategy_bench --multi-worker --sharded --adam

The optimizer step includes the update arithmetic (SGD: one multiply-add over the variables;
``--momentum 0.9``: momentum SGD, which also reads and writes a slot; ``--adam``: two slots),
so the ratio measures the strategy's overhead plus the work an optimizer must do anyway. The
two are timed alternately, step by step, and the medians compared; across workers each sample
starts after a barrier and is the slowest rank's.

``--sharded`` (multi-worker): three steps side by side, interleaved -- the bare allreduce, the
step of a ``MultiWorkerMirroredStrategy()`` and that of a
``MultiWorkerMirroredStrategy(shard_optimizer_state=True)`` (ZeRO-1) on the same gradients --
with both ratios and each one's optimizer-state bytes per worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def _side_by_side(a, b, iters: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, sampled alternately (a, b, a, b, ...) so that the
    machine's noise hits both alike."""
    t_a, t_b = _interleaved([a, b], iters)
    return t_a, t_b


def _interleaved(fns, iters: int) -> list[float]:
    """Median seconds of each of ``fns``, sampled in turn (f0, f1, ..., f0, f1, ...)."""
    for fn in fns:
        fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for fn, out in zip(fns, samples):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(s) for s in samples]


def _interleaved_across_ranks(fns, iters: int) -> list[float]:
    """Like ``_interleaved``, for calls of a process group: a barrier before every sample, and
    each sample the slowest rank's. Without the barrier a rank that finished its last call
    early (the update alone takes longer on one rank than on the other) waits inside the next
    collective, and that wait was charged to whichever call came next."""
    import pycollective as pc

    from .timing import time_interleaved

    samples = time_interleaved(
        {str(i): fn for i, fn in enumerate(fns)},
        iters=iters,
        warmup=1,
        budget_s=1e9,  # no budget: iters samples of each
        rounds=iters,  # one sample of each call in turn, as _interleaved takes them
        before_each=pc.barrier,
        max_over_ranks=lambda t: pc.allreduce(t, op="max", algo="ring"),
    )
    return [statistics.median(samples[str(i)]) for i in range(len(fns))]


def _sharded_comparison(args, count: int) -> None:
    """Bare allreduce, unsharded step and sharded step, interleaved (multi-worker)."""
    import pycollective as pc
    from pycollective.strategies import MultiWorkerMirroredStrategy, Variable
    from pycollective.strategies.sharded_state import optimizer_state_bytes

    flat = np.ones(count * args.variables, np.float32)
    out = np.empty_like(flat)
    grads = [np.ones(count, np.float32) for _ in range(args.variables)]
    steps, state = [], []
    for shard in (False, True):
        strategy = MultiWorkerMirroredStrategy(shard_optimizer_state=shard)
        with strategy.scope():
            variables = [Variable(np.zeros(count, np.float32)) for _ in range(args.variables)]
            opt = _optimizer(args)

        def step(strategy=strategy, opt=opt, variables=variables):
            strategy.run(lambda: opt.apply_gradients(zip(grads, variables)))

        step()  # creates the slots
        steps.append(step)
        state.append(optimizer_state_bytes(opt))
    # The floor on a host whose all-reduce is bound by memory bandwidth: the update kernel on
    # this worker's 1/N of the state alone (what the sharded step adds to the all-reduce).
    update_alone = _shard_update(args, count * args.variables // pc.world_size())
    t_bare, t_plain, t_sharded, t_update = _interleaved_across_ranks(
        [lambda: pc.allreduce(flat, out=out), *steps, update_alone], args.iters
    )
    if pc.rank() == 0:
        print(
            f"{args.mib} MiB of gradients in {args.variables} tensors, {pc.world_size()} "
            f"workers, {_rule(args)}, {args.iters} interleaved samples: bare allreduce "
            f"{t_bare * 1e3:.1f} ms; unsharded step {t_plain * 1e3:.1f} ms = "
            f"{t_plain / t_bare:.2f}x, optimizer state {state[0] / 2**20:.2f} MiB per worker; "
            f"sharded step {t_sharded * 1e3:.1f} ms = {t_sharded / t_bare:.2f}x, optimizer "
            f"state {state[1] / 2**20:.2f} MiB per worker ({state[1] / max(state[0], 1):.3f} "
            f"of unsharded); the update of 1/{pc.world_size()} of the state alone "
            f"{t_update * 1e3:.1f} ms = {t_update / t_bare:.2f}x",
            flush=True,
        )


def _shard_update(args, count: int):
    """The native update (pycollective.fused_update.apply) of ``count`` elements of state."""
    from pycollective import fused_update

    grad, var = np.ones(count, np.float32), np.zeros(count, np.float32)
    if args.adam:
        rule = "adam"
        hyper = fused_update.Hyper(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    else:
        rule = "momentum" if args.momentum else "sgd"
        hyper = fused_update.Hyper(lr=0.01, momentum=args.momentum)
    slots = [[np.zeros(count, np.float32)] for _ in fused_update.RULES[rule][1]]
    tensor = fused_update.ReplicatedTensor([grad], [var], slots)
    return lambda: fused_update.apply(rule, hyper, [tensor])


def _optimizer(args):
    from pycollective.strategies import SGD, Adam

    if args.adam:
        return Adam(learning_rate=0.001)
    return SGD(learning_rate=0.01, momentum=args.momentum)


def _rule(args) -> str:
    if args.adam:
        return "Adam"
    return f"SGD with momentum {args.momentum}" if args.momentum else "plain SGD"


def main(argv: list[str] | None = None) -> int:
    import pycollective as pc
    from pycollective.strategies import (
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
    p.add_argument("--adam", action="store_true", help="Adam instead of SGD")
    p.add_argument("--multi-worker", action="store_true")
    p.add_argument(
        "--sharded",
        action="store_true",
        help="multi-worker: also time the step with shard_optimizer_state=True (ZeRO-1)",
    )
    args = p.parse_args(argv)
    if args.sharded and not args.multi_worker:
        p.error("--sharded needs --multi-worker (sharding is across worker processes)")

    count = args.mib * (1 << 20) // 4 // args.variables
    if args.multi_worker and not os.environ.get("TF_CONFIG"):
        # torchrun, srun, mpirun or bench/netns_cluster.sh: join the group their environment
        # describes; the strategy then runs on it.
        pc.init()
    if args.sharded:
        _sharded_comparison(args, count)
        pc.shutdown()
        return 0
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
        opt = _optimizer(args)
    grads = [np.ones(count, np.float32) for _ in range(args.variables)]

    def step():
        def replica_fn():
            opt.apply_gradients(zip(grads, variables))

        strategy.run(replica_fn)

    if args.multi_worker:
        t_bare, t_step = _interleaved_across_ranks([bare, step], args.iters)
    else:
        t_bare, t_step = _side_by_side(bare, step, args.iters)
    where = f"{pc.world_size()} workers" if args.multi_worker else f"{args.replicas} CPU replicas"
    if not args.multi_worker or pc.rank() == 0:
        rule = _rule(args)
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
