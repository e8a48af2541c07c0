"""TPUStrategy on forced host CPU devices against MirroredStrategy and pycollective's
in-process all-reduce, in the same run:

    pycollective bench-tpu              # 4 devices / 4 replicas
    pycollective bench-tpu --replicas 8 --iters 50

Three comparisons, each timed alternately step by step (medians, as bench.strategy_bench):

1. the digits MLP (64-64-10, tanh, softmax cross-entropy; global batch 256, momentum SGD): one
   training step under TPUStrategy (the whole step -- forward, jax.grad, the gradient psum and
   the update -- is one compiled XLA program) against MirroredStrategy with the same number of
   CPU replicas (numpy forward/backward per replica thread, pycollective all-reduce fused with
   the update);
2. a model with 16 MiB of gradients (8 tensors of 2 MiB): the gradient all-reduce plus plain
   SGD, same two strategies;
3. the all-reduce alone on the same buffers: XLA's CPU psum (a jitted shard_map) against
   ``pycollective.LocalCommunicator(n).allreduce``, at several sizes.

XLA_FLAGS=--xla_force_host_platform_device_count is set here, before JAX is imported. The host
devices share the machine's cores, exactly as MirroredStrategy's replica threads do.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from .strategy_bench import _side_by_side


def _force_devices(n: int) -> None:
    if "jax" in sys.modules:
        raise SystemExit("tpu_bench must set the number of CPU devices before JAX is imported")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _digits(rows: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
    except ImportError:  # same shapes, random values
        rng = np.random.default_rng(0)
        x = rng.random((1797, 64), dtype=np.float32)
        y = rng.integers(0, 10, 1797).astype(np.int32)
    return x[:rows], y[:rows]


def _mlp_params(hidden: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(64, hidden)) * 0.3).astype(np.float32),
        np.zeros(hidden, np.float32),
        (rng.normal(size=(hidden, 10)) * 0.3).astype(np.float32),
        np.zeros(10, np.float32),
    ]


def _numpy_mlp_grads(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Gradients of the mean softmax cross-entropy of the tanh MLP, in numpy."""
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    d = p / np.float32(len(y))
    dh = (d @ w2.T) * (1 - h * h)
    return [x.T @ dh, dh.sum(axis=0), h.T @ d, d.sum(axis=0)]


def bench_mlp(n: int, iters: int, hidden: int) -> tuple[float, float]:
    import jax
    import jax.numpy as jnp

    from pycollective.strategies import SGD, MirroredStrategy, TPUStrategy, Variable

    x, y = _digits(256)
    tpu = TPUStrategy(experimental_device_assignment=n)
    mirrored = MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    with tpu.scope():
        t_vars = [Variable(p) for p in _mlp_params(hidden)]
        t_opt = SGD(0.1, momentum=0.9)
    with mirrored.scope():
        m_vars = [Variable(p) for p in _mlp_params(hidden)]
        m_opt = SGD(0.1, momentum=0.9)

    def loss(params, xb, yb):
        w1, b1, w2, b2 = params
        logits = jnp.tanh(xb @ w1 + b1) @ w2 + b2
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    def tpu_step(xb, yb):
        grads = jax.grad(loss)([v.value() for v in t_vars], xb, yb)
        t_opt.apply_gradients(zip(grads, t_vars))

    def mirrored_step(xb, yb):
        grads = _numpy_mlp_grads([np.asarray(v) for v in m_vars], xb, yb)
        m_opt.apply_gradients(zip(grads, m_vars))

    t_batch = next(iter(tpu.experimental_distribute_dataset([(x, y)])))
    m_batch = next(iter(mirrored.experimental_distribute_dataset([(x, y)])))

    def run_tpu():
        tpu.run(tpu_step, args=t_batch)
        jax.block_until_ready(t_vars[0].device_value)

    t_tpu, t_mir = _side_by_side(run_tpu, lambda: mirrored.run(mirrored_step, args=m_batch), iters)
    # steps_per_execution: a block of `block` steps as one compiled lax.scan
    block = 10
    blocks = [(x, y)] * block

    def block_step(batch):
        tpu_step(*batch)

    def run_block():
        tpu.run_steps(block_step, iter(tpu.experimental_distribute_dataset(blocks)), steps=block)
        jax.block_until_ready(t_vars[0].device_value)

    t_block, _ = _side_by_side(run_block, lambda: None, max(iters // block, 5))
    return t_tpu, t_mir, t_block / block


def bench_16mib(n: int, iters: int, mib: int, tensors: int) -> tuple[float, float]:
    import jax
    import jax.numpy as jnp

    from pycollective.strategies import SGD, MirroredStrategy, TPUStrategy, Variable

    count = mib * (1 << 20) // 4 // tensors
    tpu = TPUStrategy(experimental_device_assignment=n)
    mirrored = MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    with tpu.scope():
        t_vars = [Variable(np.zeros(count, np.float32)) for _ in range(tensors)]
        t_opt = SGD(0.01)
    with mirrored.scope():
        m_vars = [Variable(np.zeros(count, np.float32)) for _ in range(tensors)]
        m_opt = SGD(0.01)
    grads = [np.ones(count, np.float32) for _ in range(tensors)]
    scale = tpu.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group + 1)
    )

    def tpu_step(s):
        # per-replica gradients (they depend on the replica), so the psum is real work
        t_opt.apply_gradients((jnp.full(count, s, jnp.float32), v) for v in t_vars)

    def run_tpu():
        tpu.run(tpu_step, args=(scale,))
        jax.block_until_ready(t_vars[-1].device_value)

    def run_mirrored():
        mirrored.run(lambda: m_opt.apply_gradients(zip(grads, m_vars)))

    return _side_by_side(run_tpu, run_mirrored, iters)


def bench_allreduce(n: int, iters: int, nbytes: int) -> tuple[float, float]:
    import jax
    from jax import lax
    from jax.sharding import AxisType, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import pycollective as pc

    count = max(nbytes // 4, 1)
    mesh = Mesh(np.array(jax.devices()[:n]), ("r",), axis_types=(AxisType.Auto,))
    x = jax.device_put(np.ones((n, count), np.float32), NamedSharding(mesh, P("r")))
    psum = jax.jit(
        jax.shard_map(lambda a: lax.psum(a, "r"), mesh=mesh, in_specs=P("r"), out_specs=P("r"))
    )
    comm = pc.LocalCommunicator(n)
    bufs = [np.ones(count, np.float32) for _ in range(n)]
    outs = [np.empty_like(b) for b in bufs]
    return _side_by_side(
        lambda: psum(x).block_until_ready(), lambda: comm.allreduce(bufs, out=outs), iters
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64, help="MLP hidden units")
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument(
        "--sizes",
        default="4096,262144,4194304,16777216",
        help="all-reduce sizes in bytes per replica (comma-separated)",
    )
    args = p.parse_args(argv)
    _force_devices(args.replicas)
    import jax

    n = args.replicas
    print(
        f"jax {jax.__version__}, {len(jax.devices())} forced {jax.default_backend()} devices, "
        f"{os.cpu_count()} cores; medians of {args.iters} alternating samples"
    )
    t_tpu, t_mir, t_scan = bench_mlp(n, args.iters, args.hidden)
    print(
        f"digits MLP 64-{args.hidden}-10, global batch 256, momentum SGD: TPUStrategy "
        f"{t_tpu * 1e3:.2f} ms/step (run_steps, 10 per program: {t_scan * 1e3:.2f} ms/step), "
        f"MirroredStrategy ({n} CPU replicas) {t_mir * 1e3:.2f} ms/step; "
        f"TPUStrategy/Mirrored {t_tpu / t_mir:.2f}x"
    )
    t_tpu, t_mir = bench_16mib(n, args.iters, args.mib, args.tensors)
    print(
        f"{args.mib} MiB of gradients in {args.tensors} tensors, plain SGD: TPUStrategy "
        f"{t_tpu * 1e3:.2f} ms/step, MirroredStrategy ({n} CPU replicas) "
        f"{t_mir * 1e3:.2f} ms/step; TPUStrategy/Mirrored {t_tpu / t_mir:.2f}x"
    )
    for nbytes in (int(s) for s in args.sizes.split(",")):
        t_xla, t_pc = bench_allreduce(n, args.iters, nbytes)
        busbw = lambda t, nbytes=nbytes: nbytes * 2 * (n - 1) / n / t / 1e9  # noqa: E731
        print(
            f"all-reduce {nbytes} B x {n}: XLA CPU psum {t_xla * 1e6:.1f} us "
            f"({busbw(t_xla):.2f} GB/s busbw), LocalCommunicator.allreduce "
            f"{t_pc * 1e6:.1f} us ({busbw(t_pc):.2f} GB/s); XLA/pycollective "
            f"{t_xla / t_pc:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
