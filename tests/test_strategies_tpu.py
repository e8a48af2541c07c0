"""TPUStrategy on forced host CPU devices (JAX/XLA): compiled replica steps, the gradient trap,
uneven batches, checkpoints shared with MirroredStrategy, steps per execution, and several
processes under ``pycollective run``.

JAX fixes its number of CPU devices when its backend starts. This module asks for 8 (config
``jax_num_cpu_devices``) when it is imported; if JAX was already started in this pytest process
with fewer, the in-process tests skip and ``test_rerun_in_fresh_process`` runs this file again
in a fresh interpreter with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pycollective import strategies as ds
from pycollective._spawn import in_own_process_group

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tpu_models as tm  # noqa: E402

DEVICES = 8

try:
    import jax
except ImportError:  # pragma: no cover - depends on the environment
    jax = None


def _force_cpu_devices() -> str | None:
    """Asks JAX for DEVICES host CPU devices; returns why that is impossible, or None."""
    from pycollective.strategies.tpu import _jax

    if not _jax.backend_initialized():
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", DEVICES)
    if jax.default_backend() != "cpu" or len(jax.devices()) < DEVICES:
        return (
            f"JAX was started earlier in this process with {len(jax.devices())} "
            f"{jax.default_backend()} device(s); test_rerun_in_fresh_process runs this file "
            f"with {DEVICES} forced CPU devices"
        )
    return None


NO_JAX = 'JAX is not installed (pip install "pycollective[tpu]")'
WHY_NOT = NO_JAX if jax is None else _force_cpu_devices()
needs_jax = pytest.mark.skipif(jax is None, reason=NO_JAX)
in_process = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def strategy(n: int) -> ds.TPUStrategy:
    return ds.TPUStrategy(experimental_device_assignment=n)


def digits_batches(rows: int = 256, batch: int = 64):
    x, y = tm.digits(rows)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, rows, batch)]


def assert_params_close(got, want, rtol=2e-5, atol=2e-6):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


# Training equals single-device training --------------------------------------------------------


@in_process
@pytest.mark.parametrize(
    "replicas,opt,lr",
    [(1, "sgd", 0.1), (2, "adam", 0.01), (4, "sgd", 0.1), (4, "adam", 0.01), (8, "sgd", 0.1)],
)
def test_digits_mlp_reaches_single_device_parameters(replicas, opt, lr):
    batches = digits_batches()
    p0 = tm.init_params()
    want = tm.reference_train(p0, batches, opt, lr)
    got, variables, optimizer = tm.strategy_train(ds, strategy(replicas), p0, batches, opt, lr)
    assert int(optimizer.iterations.numpy()) == len(batches)
    assert_params_close(got, want)
    # and the training moved the parameters (a no-op step would not match the reference)
    assert not np.allclose(got["w1"], p0["w1"])


# The gradient trap -----------------------------------------------------------------------------


def _one_sgd_step(s: ds.TPUStrategy, x: np.ndarray) -> np.ndarray:
    with s.scope():
        w = ds.Variable(np.ones(3, np.float32), name="w")
        opt = ds.SGD(1.0)

    def step(xb):
        g = jax.grad(lambda v: jax.numpy.sum(v * xb))(w.value())  # = this replica's rows' sum
        opt.apply_gradients([(g, w)])
        return g

    grads = s.run(step, args=(next(iter(s.experimental_distribute_dataset([x]))),))
    return w.numpy(), grads


@in_process
@pytest.mark.parametrize("replicas", [2, 4])
def test_gradient_is_per_replica_and_averaged_once(replicas):
    """jax.grad of a replicated variable must give this replica's gradient; apply_gradients'
    MEAN then averages it once. (Read as an invariant value, shard_map's varying-axes typing
    makes jax.grad return the SUM over replicas, and the MEAN on top an N-times gradient.)"""
    s = strategy(replicas)
    x = np.arange(replicas * 2 * 3, dtype=np.float32).reshape(replicas * 2, 3)
    w, grads = _one_sgd_step(s, x)
    per_replica = x.reshape(replicas, 2, 3).sum(axis=1)
    np.testing.assert_allclose(
        np.stack([np.asarray(g) for g in s.experimental_local_results(grads)]), per_replica
    )
    np.testing.assert_allclose(w, 1.0 - per_replica.mean(axis=0), rtol=1e-6)


def _sgd_step_on_argument(s, x: np.ndarray):
    """jax.grad with respect to parameters passed as a (replicated) argument of run, JAX style;
    the gradient goes to apply_gradients (MEAN) and to an explicit all_reduce(MEAN)."""
    with s.scope():
        w = ds.Variable(np.ones(3, np.float32), name="w")
        opt = ds.SGD(1.0)

    def step(params, xb):
        g = jax.grad(lambda p: jax.numpy.sum(p * jax.numpy.asarray(xb)))(params)
        opt.apply_gradients([(g, w)])
        return ds.get_replica_context().all_reduce("MEAN", g)

    batch = next(iter(s.experimental_distribute_dataset([x])))
    mean = s.run(step, args=(np.ones(3, np.float32), batch))
    return w.numpy(), np.asarray(s.experimental_local_results(mean)[0])


@in_process
@pytest.mark.parametrize("replicas", [2, 4])
def test_gradient_with_respect_to_an_argument_is_per_replica(replicas):
    """Parameters passed as an argument of run (not a variable) must be per-replica values too:
    the same step gives what MirroredStrategy gives."""
    x = np.arange(replicas * 2 * 3, dtype=np.float32).reshape(replicas * 2, 3)
    want = x.reshape(replicas, 2, 3).sum(axis=1).mean(axis=0)
    w, mean = _sgd_step_on_argument(strategy(replicas), x)
    np.testing.assert_allclose(mean, want, rtol=1e-6)
    np.testing.assert_allclose(w, 1.0 - want, rtol=1e-6)
    mw, mmean = _sgd_step_on_argument(
        ds.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)]), x
    )
    np.testing.assert_allclose(w, mw, rtol=1e-6)
    np.testing.assert_allclose(mean, mmean, rtol=1e-6)


@in_process
def test_apply_gradients_of_plain_gradients_in_cross_replica_context():
    """A plain (non-distributed) gradient applied outside run is applied as it is, with or
    without skip_gradients_aggregation (it is the same on every replica)."""
    s = strategy(4)
    with s.scope():
        w = ds.Variable(np.ones(3, np.float32), name="w")
        opt = ds.SGD(1.0)
    g = np.array([1.0, 2.0, 3.0], np.float32)
    opt.apply_gradients([(g, w)])
    np.testing.assert_allclose(w.numpy(), 1.0 - g)
    opt.apply_gradients([(g, w)], skip_gradients_aggregation=True)
    np.testing.assert_allclose(w.numpy(), 1.0 - 2 * g)


@in_process
def test_the_trap_is_caught(monkeypatch):
    """The checks above fail when variables or arguments enter the step as invariant values:
    the trap is real and the tests see it."""
    from pycollective.strategies.tpu import step as tpu_step

    replicas = 4
    x = np.arange(replicas * 2 * 3, dtype=np.float32).reshape(replicas * 2, 3)
    mean_grad = x.reshape(replicas, 2, 3).sum(axis=1).mean(axis=0)
    with monkeypatch.context() as m:  # variables read as invariant values
        m.setattr(
            tpu_step,
            "read",
            lambda var: (
                tpu_step.current().get(var)
                if tpu_step.tracing_for(var.distribute_strategy)
                else None
            ),
        )
        w, _ = _one_sgd_step(strategy(replicas), x)
    np.testing.assert_allclose(w, 1.0 - replicas * mean_grad, rtol=1e-6)  # N times
    with monkeypatch.context() as m:  # replicated arguments passed as invariant values
        m.setattr(tpu_step, "as_per_replica", lambda value: value)
        w, mean = _sgd_step_on_argument(strategy(replicas), x)
    np.testing.assert_allclose(mean, replicas * mean_grad, rtol=1e-6)
    np.testing.assert_allclose(w, 1.0 - replicas * mean_grad, rtol=1e-6)
    # and without the patches the same steps give the true gradient
    w, _ = _one_sgd_step(strategy(replicas), x)
    np.testing.assert_allclose(w, 1.0 - mean_grad, rtol=1e-6)
    w, mean = _sgd_step_on_argument(strategy(replicas), x)
    np.testing.assert_allclose(mean, mean_grad, rtol=1e-6)


@in_process
def test_arrays_read_from_a_variable_survive_the_next_step():
    """A step donates the variables' buffers; what jnp.asarray(v) or a pytree leaf of v handed
    out before must still be readable after it (a copy, not the donated buffer)."""
    s = strategy(4)
    x = np.arange(4 * 2 * 3, dtype=np.float32).reshape(8, 3)
    with s.scope():
        w = ds.Variable(np.ones(3, np.float32), name="w")
        opt = ds.SGD(1.0)
    snap = jax.numpy.asarray(w)
    leaf = jax.tree_util.tree_leaves(w)[0]
    doubled = jax.jit(lambda v: v * 2)(w)

    def step(xb):
        opt.apply_gradients([(jax.grad(lambda v: jax.numpy.sum(v * xb))(w.value()), w)])

    batch = next(iter(s.experimental_distribute_dataset([x])))
    s.run(step, args=(batch,))
    s.run(step, args=(batch,))
    np.testing.assert_array_equal(np.asarray(snap), np.ones(3))
    np.testing.assert_array_equal(np.asarray(leaf), np.ones(3))
    np.testing.assert_array_equal(np.asarray(doubled), 2 * np.ones(3))
    assert not np.allclose(w.numpy(), 1.0)


@in_process
def test_reads_from_another_thread_wait_for_the_running_step():
    """A step donates the variables' buffers: a cross-replica read on another thread while
    steps run must see the old or the new value, never a deleted array."""
    import threading

    s = strategy(4)
    with s.scope():
        w = ds.Variable(np.zeros(256, np.float32), name="w")
        opt = ds.SGD(1.0)
    batch = next(iter(s.experimental_distribute_dataset([np.ones((8, 256), np.float32)])))

    def step(xb):
        opt.apply_gradients([(jax.grad(lambda v: jax.numpy.sum(v * xb))(w.value()), w)])

    s.run(step, args=(batch,))  # compiled before the race
    errors, done = [], threading.Event()

    def reader():
        while not done.is_set():
            try:
                np.asarray(w)
                np.asarray(jax.numpy.asarray(w))
                w.assign_add(np.zeros(256, np.float32))
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(200):
            s.run(step, args=(batch,))
    finally:
        done.set()
        t.join()
    assert not errors, errors[0]
    assert float(w.numpy()[0]) == -2.0 * 201


# Replica-context collectives and cross-replica reductions -------------------------------------


@in_process
def test_collectives_reduce_gather_and_local_results():
    s = strategy(4)

    def fn():
        ctx = ds.get_replica_context()
        r = ctx.replica_id_in_sync_group.astype(np.float32)
        v = jax.numpy.stack([r, 2 * r])
        return (
            v,
            ctx.all_reduce("SUM", v),
            ctx.all_reduce(ds.ReduceOp.MEAN, v),
            ctx.all_gather(v[None], axis=0),
        )

    v, total, mean, gathered = s.run(fn)
    assert len(s.experimental_local_results(v)) == 4
    assert [np.asarray(c).tolist() for c in s.experimental_local_results(v)] == [
        [0, 0],
        [1, 2],
        [2, 4],
        [3, 6],
    ]
    for c in s.experimental_local_results(total):
        assert np.asarray(c).tolist() == [6, 12]
    for c in s.experimental_local_results(mean):
        assert np.asarray(c).tolist() == [1.5, 3]
    for c in s.experimental_local_results(gathered):
        assert np.asarray(c).tolist() == [[0, 0], [1, 2], [2, 4], [3, 6]]
    assert np.asarray(s.reduce("SUM", v, axis=None)).tolist() == [6, 12]
    assert np.asarray(s.reduce("MEAN", v, axis=None)).tolist() == [1.5, 3]
    assert float(s.reduce("SUM", v, axis=0)) == 18
    assert float(s.reduce("MEAN", v, axis=0)) == 18 / 8
    assert np.asarray(s.gather(v, axis=0)).tolist() == [0, 0, 1, 2, 2, 4, 3, 6]
    # extended's cross-replica members
    ext = s.extended
    assert np.asarray(ext.reduce_to("SUM", v, "/cpu:0")).tolist() == [6, 12]
    assert [
        np.asarray(r).tolist() for r in ext.batch_reduce_to("MEAN", [(v, None), (total, None)])
    ] == [[1.5, 3], [6, 12]]
    assert np.asarray(ext.broadcast_to(np.arange(3), None)).tolist() == [0, 1, 2]
    with s.scope():
        w = ds.Variable(np.ones(2, np.float32))
    ext.update(w, lambda var, d: var.assign_add(d), args=(np.full(2, 2, np.float32),))
    assert w.numpy().tolist() == [3, 3]
    # tf's rules for values that are not distributed
    assert np.asarray(s.reduce("MEAN", np.ones(2, np.float32))).tolist() == [1, 1]
    with pytest.raises(ValueError, match="SUM"):
        s.reduce("SUM", np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="cross-replica"):
        s.run(lambda: s.reduce("SUM", np.ones(2)))


@in_process
def test_variable_updates_follow_their_aggregation():
    s = strategy(4)
    with s.scope():
        total = ds.Variable(np.zeros(2, np.float32), aggregation="SUM")
        mean = ds.Variable(np.zeros(2, np.float32), aggregation="MEAN")
        first = ds.Variable(np.zeros(2, np.float32), aggregation="ONLY_FIRST_REPLICA")
        plain = ds.Variable(np.zeros(2, np.float32))

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group.astype(np.float32) + 1
        total.assign_add(jax.numpy.full(2, r))
        mean.assign(jax.numpy.full(2, r))
        first.assign_sub(jax.numpy.full(2, r))
        plain.assign(plain.value() + 5)  # the same on every replica: allowed

    s.run(fn)
    assert total.numpy().tolist() == [10, 10]
    assert mean.numpy().tolist() == [2.5, 2.5]
    assert first.numpy().tolist() == [-1, -1]
    assert plain.numpy().tolist() == [5, 5]
    with pytest.raises(ValueError, match="aggregation NONE"):
        s.run(
            lambda: plain.assign(
                jax.numpy.full(2, ds.get_replica_context().replica_id_in_sync_group, np.float32)
            )
        )
    # cross-replica updates and reads
    plain.assign(np.array([3, 4], np.float32))
    assert np.asarray(plain).tolist() == [3, 4]


@in_process
def test_apply_gradients_in_cross_replica_context_and_results_fed_back():
    s = strategy(4)
    with s.scope():
        w = ds.Variable(np.zeros(2, np.float32))
        opt = ds.SGD(1.0)
    opt.apply_gradients([(np.array([1, 2], np.float32), w)])  # plain: applied as it is
    assert w.numpy().tolist() == [-1, -2]
    per_replica = s.run(
        lambda: jax.numpy.full(2, ds.get_replica_context().replica_id_in_sync_group, np.float32)
    )
    opt.apply_gradients([(per_replica, w)])  # PerReplica: averaged (MEAN) over replicas
    assert w.numpy().tolist() == [-2.5, -3.5]
    doubled = s.run(lambda v: 2 * v, args=(per_replica,))  # stays on the devices
    assert [float(c[0]) for c in s.experimental_local_results(doubled)] == [0, 2, 4, 6]
    assert int(opt.iterations.numpy()) == 2


@in_process
def test_sync_on_read_variables_count_per_replica_and_aggregate_on_read(tmp_path):
    s = strategy(4)
    with s.scope():
        correct = ds.Variable(
            0.0, synchronization="ON_READ", aggregation="SUM", trainable=False, name="correct"
        )
        mean = ds.Variable(
            np.zeros(2, np.float32),
            synchronization="ON_READ",
            aggregation="MEAN",
            trainable=False,
            name="mean",
        )
        first = ds.Variable(
            0.0,
            synchronization="ON_READ",
            aggregation="ONLY_FIRST_REPLICA",
            trainable=False,
            name="first",
        )

    def count(x):
        correct.assign_add(jax.numpy.sum(x))  # this replica's copy, no communication
        mean.assign(
            jax.numpy.full(2, ds.get_replica_context().replica_id_in_sync_group, np.float32)
        )
        first.assign(ds.get_replica_context().replica_id_in_sync_group + 7.0)
        return correct.value()  # this replica's running count

    batches = [np.arange(8, dtype=np.float32), np.ones(8, np.float32)]
    it = iter(s.experimental_distribute_dataset(batches))
    s.run(count, args=(next(it),))
    local = s.run(count, args=(next(it),))
    assert [float(c) for c in s.experimental_local_results(local)] == [3, 7, 11, 15]
    assert float(correct.numpy()) == 28 + 8  # SUM over replicas, on read
    assert mean.numpy().tolist() == [1.5, 1.5]
    assert float(first.numpy()) == 7.0
    path = ds.Checkpoint(correct=correct).write(str(tmp_path / "m.npz"))
    correct.assign(4.0)  # cross-replica: spread so that the aggregate reads 4
    assert float(correct.numpy()) == 4.0
    assert [float(c) for c in s.experimental_local_results(correct)] == [1, 1, 1, 1]
    ds.Checkpoint(correct=correct).restore(path)
    assert float(correct.numpy()) == 36.0
    with s.scope():
        total = ds.Variable(0.0, synchronization="ON_READ", aggregation="SUM", trainable=False)
    s.run_steps(
        lambda x: total.assign_add(jax.numpy.sum(x)),
        iter(s.experimental_distribute_dataset(batches)),
        steps=2,
    )
    assert float(total.numpy()) == 36.0


# Uneven batches ----------------------------------------------------------------------------------


@in_process
def test_uneven_last_batch_is_padded_and_masked():
    """Documented rule: a global batch of B rows gives replica r its split_bounds share padded
    with zero rows to ceil(B/N); experimental_valid_rows says how many rows are real. A loss
    that masks the padding and divides by the global batch size, with SUM aggregation, trains
    exactly like one device on the whole batch."""
    replicas = 4
    s = strategy(replicas)
    x, y = tm.digits(74)
    batches = [(x[:64], y[:64]), (x[64:], y[64:])]  # the last: 10 rows -> 3, 3, 2, 2
    p0 = tm.init_params()
    want = tm.reference_train(p0, batches, "sgd", 0.1)

    with s.scope():
        variables = {k: ds.Variable(v, name=k) for k, v in p0.items()}
        opt = tm.make_optimizer(ds, "sgd", 0.1, gradient_aggregation="SUM")
    seen = []

    def step(xb, yb, global_batch):
        ctx = ds.get_replica_context()
        mask = jax.numpy.arange(xb.shape[0]) < ctx.experimental_valid_rows
        values = {k: v.value() for k, v in variables.items()}
        grads = jax.grad(
            lambda p: jax.numpy.sum(jax.numpy.where(mask, tm.losses(p, xb, yb), 0.0)) / global_batch
        )(values)
        opt.apply_gradients([(grads[k], variables[k]) for k in sorted(variables)])
        return ctx.experimental_valid_rows, xb

    for (xb, yb), (gx, _) in zip(s.experimental_distribute_dataset(batches), batches):
        seen.append(s.run(step, args=(xb, yb, np.float32(len(gx)))))
    rows, padded = seen[-1]
    assert [int(r) for r in s.experimental_local_results(rows)] == [3, 3, 2, 2]
    parts = [np.asarray(p) for p in s.experimental_local_results(padded)]
    assert all(p.shape == (3, 64) for p in parts)
    np.testing.assert_array_equal(parts[2][2], 0)  # padding rows are zeros
    np.testing.assert_array_equal(
        np.concatenate([p[:n] for p, n in zip(parts, [3, 3, 2, 2])]), x[64:]
    )
    assert_params_close({k: v.numpy() for k, v in variables.items()}, want)


@needs_jax
def test_adam_step_size_is_computed_in_float32_for_half_precision_variables():
    """beta ** t in float16 loses its digits (0.999 ** 1000: 0.8% off the step size)."""
    import jax.numpy as jnp

    opt = ds.Adam(0.1)
    ones = jnp.ones(3, jnp.float16)
    new, _ = opt._functional_update(
        jnp.zeros(3, jnp.float16), ones, {"m": ones, "v": ones}, 0.1, jnp.int32(999), jnp
    )
    t = np.float32(1000)
    alpha = 0.1 * np.sqrt(1 - np.float32(0.999) ** t) / (1 - np.float32(0.9) ** t)
    assert new.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(new), np.float16(-alpha / (1 + 1e-7)))


@in_process
@pytest.mark.parametrize("replicas", [1, 4])
def test_non_distributed_values_reduce_as_under_mirrored_strategy(replicas):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for s in (strategy(replicas), ds.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])):
        mean = np.asarray(s.reduce("MEAN", x))
        along = np.asarray(s.reduce("MEAN", x, axis=0))
        np.testing.assert_allclose(mean, x)
        np.testing.assert_allclose(along, x.mean(axis=0))
        if replicas == 1:  # one local replica: the value is that replica's value
            np.testing.assert_allclose(np.asarray(s.reduce("SUM", x)), x)
            np.testing.assert_allclose(np.asarray(s.reduce("SUM", x, axis=1)), x.sum(axis=1))
        else:  # along an axis, every replica's value (tf runs the sum on each replica)
            np.testing.assert_allclose(np.asarray(s.reduce("SUM", x, axis=0)), 4 * x.sum(axis=0))
            with pytest.raises(ValueError, match="cannot be reduced with ReduceOp.SUM"):
                s.reduce("SUM", x, axis=None)


@in_process
@pytest.mark.filterwarnings("ignore:.*experimental_valid_rows")
def test_reduce_and_gather_along_the_batch_axis_leave_the_padding_out():
    """5 rows over 4 replicas (2, 1, 1, 1, padded to 2): reduce/gather along axis 0 of a
    result with the batch's rows give what MirroredStrategy gives on the unpadded split."""
    x = np.arange(1, 6, dtype=np.float32)
    xy = np.arange(10, dtype=np.float32).reshape(5, 2)
    got = {}
    for s in (strategy(4), ds.MirroredStrategy([f"/cpu:{i}" for i in range(4)])):
        b = next(iter(s.experimental_distribute_dataset([(x, xy)])))
        out, out2 = s.run(lambda v, w: (v * 1.0, w + 0.0), args=b)
        got[type(s).__name__] = [
            np.asarray(r)
            for r in (
                s.reduce("MEAN", out, axis=0),
                s.reduce("SUM", out, axis=0),
                s.reduce("MEAN", out2, axis=0),
                s.reduce("MEAN", out2, axis=-2),
                s.gather(out, axis=0),
                s.gather(out2, axis=0),
                s.reduce("MEAN", b[0], axis=0),
                s.gather(b[1], axis=0),
            )
        ]
    tpu, mirrored = got["TPUStrategy"], got["MirroredStrategy"]
    assert float(tpu[0]) == 3.0 and float(tpu[1]) == 15.0
    np.testing.assert_array_equal(tpu[4], x)
    np.testing.assert_array_equal(tpu[5], xy)
    for t, m in zip(tpu, mirrored):
        np.testing.assert_allclose(t, m, rtol=1e-6)


@in_process
def test_an_unmasked_step_on_a_padded_batch_warns_once():
    s = strategy(4)
    padded = next(iter(s.experimental_distribute_dataset([np.ones((5, 3), np.float32)])))
    even = next(iter(s.experimental_distribute_dataset([np.ones((8, 3), np.float32)])))
    with pytest.warns(UserWarning, match="experimental_valid_rows"):
        s.run(lambda b: jax.numpy.mean(b), args=(padded,))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.run(lambda b: jax.numpy.mean(b), args=(padded,))  # once per strategy
        s2 = strategy(4)
        s2.run(lambda b: jax.numpy.mean(b), args=(even,))  # nothing padded
        s2.run(
            lambda b: jax.numpy.sum(
                jax.numpy.where(  # masked
                    jax.numpy.arange(2) < ds.get_replica_context().experimental_valid_rows,
                    jax.numpy.sum(b, axis=1),
                    0.0,
                )
            ),
            args=(padded,),
        )


@in_process
def test_datasets_from_function_pad_the_replicas_whose_pipeline_ended():
    s = strategy(4)
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        return [np.full((2, 3), i, np.float32) for i in range(6)]  # 6 per-replica batches

    def fn(x):
        ctx = ds.get_replica_context()
        return ctx.experimental_valid_rows, jax.numpy.sum(x)

    outs = [s.run(fn, args=(x,)) for x in s.distribute_datasets_from_function(dataset_fn)]
    assert contexts[0].num_replicas_in_sync == 4 and contexts[0].num_input_pipelines == 1
    rows, sums = outs[-1]  # the second step got batches 4 and 5, then the pipeline ended
    assert [int(r) for r in s.experimental_local_results(rows)] == [2, 2, 0, 0]
    assert [float(t) for t in s.experimental_local_results(sums)] == [24, 30, 0, 0]


# Checkpoints: one format for every strategy -----------------------------------------------------


@in_process
def test_checkpoint_moves_between_tpu_and_mirrored(tmp_path):
    batches = digits_batches(128)
    p0 = tm.init_params()
    tpu = strategy(4)
    _, variables, opt = tm.strategy_train(ds, tpu, p0, batches, "adam", 0.01)
    path = ds.Checkpoint(model=variables, opt=opt).write(str(tmp_path / "tpu.npz"))

    mirrored = ds.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with mirrored.scope():
        m_vars = {k: ds.Variable(np.zeros_like(v), name=k) for k, v in p0.items()}
        m_opt = ds.Adam(0.01)
    ds.Checkpoint(model=m_vars, opt=m_opt).restore(path).assert_consumed()
    for k, v in variables.items():
        np.testing.assert_array_equal(m_vars[k].numpy(), v.numpy())
        np.testing.assert_array_equal(
            m_opt.get_slot(m_vars[k], "m").numpy(), opt.get_slot(v, "m").numpy()
        )
    assert int(m_opt.iterations.numpy()) == len(batches)
    assert m_opt.iterations.numpy().dtype == np.int64

    # ... one more step under MirroredStrategy, then back to TPUStrategy
    for k in m_vars:
        m_vars[k].assign(m_vars[k].numpy() * 0.5)
    back_path = ds.Checkpoint(model=m_vars, opt=m_opt).write(str(tmp_path / "mirrored.npz"))
    tpu2 = strategy(2)
    with tpu2.scope():
        t_vars = {k: ds.Variable(np.zeros_like(v), name=k) for k, v in p0.items()}
        t_opt = ds.Adam(0.01)
    ds.Checkpoint(model=t_vars, opt=t_opt).restore(back_path).assert_consumed()
    for k in m_vars:
        np.testing.assert_array_equal(t_vars[k].numpy(), m_vars[k].numpy())
        np.testing.assert_array_equal(
            t_opt.get_slot(t_vars[k], "v").numpy(), m_opt.get_slot(m_vars[k], "v").numpy()
        )
    assert int(t_opt.iterations.numpy()) == len(batches)


# Steps per execution ------------------------------------------------------------------------------


@in_process
def test_run_steps_scans_a_block_of_steps():
    batches = digits_batches(320)  # 5 batches: a block of 3, then a block cut short (2)
    p0 = tm.init_params()
    want = tm.reference_train(p0, batches, "sgd", 0.1)
    s = ds.TPUStrategy(experimental_device_assignment=4, steps_per_execution=3)
    assert s.extended.steps_per_execution == 3
    with s.scope():
        variables = {k: ds.Variable(v, name=k) for k, v in p0.items()}
        opt = ds.SGD(0.1, momentum=0.9)
    traced = []

    def step(batch):
        traced.append(1)  # a Python side effect: runs at trace time only
        xb, yb = batch
        values = {k: v.value() for k, v in variables.items()}
        grads = jax.grad(lambda p: jax.numpy.mean(tm.losses(p, xb, yb)))(values)
        opt.apply_gradients([(grads[k], variables[k]) for k in sorted(variables)])
        return opt.iterations.value()

    it = iter(s.experimental_distribute_dataset(batches))
    last = s.run_steps(step, it)
    assert {int(c) for c in s.experimental_local_results(last)} == {3}  # after the 3rd step
    s.run_steps(step, it)
    assert s.run_steps(step, it) is None  # exhausted
    assert int(opt.iterations.numpy()) == 5
    assert_params_close({k: v.numpy() for k, v in variables.items()}, want)
    # Traced per program, not once per step: per block length (3, then 2), one plain step
    # traced without running (so that the optimizer's slots exist before the scan's carry is
    # fixed) and the scan's one trace.
    assert len(traced) == 4
    with pytest.raises(ValueError, match="positive"):
        s.extended.steps_per_execution = 0


@in_process
def test_run_steps_needs_an_iterator():
    """A dataset would restart at its first element on every call (and a loop until None would
    never end): run_steps refuses it and names what to pass."""
    s = strategy(4)
    data = [np.full((4, 1), i, np.float32) for i in range(6)]
    dataset = s.experimental_distribute_dataset(data)
    with pytest.raises(TypeError, match=r"iter\(dataset\)"):
        s.run_steps(lambda b: jax.numpy.max(b), dataset, steps=2)
    it = iter(dataset)
    seen = []
    while (out := s.run_steps(lambda b: jax.numpy.max(b), it, steps=2)) is not None:
        seen.append(float(s.experimental_local_results(out)[0]))
    assert seen == [1, 3, 5]


# What a compiled step cannot do ---------------------------------------------------------------


@in_process
def test_fn_is_traced_once_per_signature():
    s = strategy(2)
    with s.scope():
        w = ds.Variable(np.zeros(3, np.float32))
    traces = []

    def fn(x, scale):
        traces.append(x.shape)  # a Python side effect: at trace time only
        w.assign_add(x.sum(axis=0) * scale, read_value=False)

    for _ in range(3):
        s.run(fn, args=(ds.PerReplica([np.ones((2, 3), np.float32)] * 2), 1.0))
    assert traces == [(2, 3)]
    s.run(fn, args=(ds.PerReplica([np.ones((4, 3), np.float32)] * 2), 1.0))  # new shape
    s.run(fn, args=(ds.PerReplica([np.ones((2, 3), np.float32)] * 2), 2.0))  # new constant
    assert traces == [(2, 3), (4, 3), (2, 3)]
    assert w.numpy().tolist() == [3 * 2 + 4 + 4] * 3  # agg NONE: every replica added the same


@in_process
def test_untraceable_functions_raise_errors_that_name_the_limit():
    from pycollective.strategies.tpu import StepTraceError

    s = strategy(2)
    with s.scope():
        w = ds.Variable(np.ones(2, np.float32))
    with pytest.raises(StepTraceError, match="traceable by JAX"):
        s.run(lambda: float(w.value().sum()))
    with pytest.raises(StepTraceError, match="traceable by JAX"):
        s.run(lambda: 1 if w.value().sum() > 0 else 0)
    with pytest.raises(StepTraceError, match="v.value()"):
        s.run(lambda: np.asarray(w))
    # a variable stands where JAX wants an array
    assert float(jax.numpy.sum(w)) == 2.0
    grads = s.run(lambda: jax.grad(lambda v: jax.numpy.sum(v * 3))(w))
    assert [np.asarray(g).tolist() for g in s.experimental_local_results(grads)] == [[3, 3]] * 2
    other = strategy(2)
    with pytest.raises(ValueError, match="its own strategy's variables"):
        other.run(lambda: w.value() + 1)
    with pytest.raises(NotImplementedError, match="merge_call"):
        s.run(lambda: ds.get_replica_context().merge_call(lambda strat: None))
    with pytest.raises(NotImplementedError, match="spmd"):
        ds.TPUStrategy(experimental_spmd_xla_partitioning=True)


@in_process
def test_cluster_resolver_wraps_the_local_devices(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="pycollective.strategies"):
        resolver = ds.TPUClusterResolver()
    assert resolver.platform == "cpu"
    assert resolver.num_accelerators() == {"CPU": DEVICES}
    assert "no TPU" in caplog.text
    assert resolver.cluster_spec().as_dict() == {}
    s = ds.TPUStrategy(resolver)
    assert s.num_replicas_in_sync == DEVICES and s.cluster_resolver is resolver
    with pytest.raises(ValueError, match="tpu='local'"):
        ds.TPUClusterResolver(tpu="grpc://10.0.0.2:8470")
    with pytest.raises(ValueError, match="Cloud"):
        ds.TPUClusterResolver(zone="us-central1-b")


@in_process
def test_what_tpu_strategy_cannot_honour_is_refused_by_name():
    class DeviceAssignment:  # tf's, with two cores per replica (model parallelism)
        num_replicas = 2
        num_cores_per_replica = 2

    with pytest.raises(NotImplementedError, match="num_cores_per_replica=2.*model parallelism"):
        ds.TPUStrategy(experimental_device_assignment=DeviceAssignment())
    DeviceAssignment.num_cores_per_replica = 1
    assert (
        ds.TPUStrategy(experimental_device_assignment=DeviceAssignment()).num_replicas_in_sync == 2
    )
    s = strategy(2)
    data = [np.ones((4, 1), np.float32)]
    for options, field in [
        (ds.InputOptions(experimental_fetch_to_device=False), "experimental_fetch_to_device"),
        (
            ds.InputOptions(experimental_place_dataset_on_device=True),
            "experimental_place_dataset_on_device",
        ),
        (
            ds.InputOptions(experimental_per_replica_buffer_size=4),
            "experimental_per_replica_buffer_size",
        ),
    ]:
        with pytest.raises(NotImplementedError, match=field):
            s.experimental_distribute_dataset(data, options=options)
        with pytest.raises(NotImplementedError, match=field):
            s.distribute_datasets_from_function(lambda ctx: data, options=options)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        s.experimental_distribute_dataset(
            data,
            options=ds.InputOptions(
                experimental_replication_mode=ds.InputReplicationMode.PER_REPLICA
            ),
        )
    s.experimental_distribute_dataset(data, options=ds.InputOptions())  # the defaults


@in_process
@pytest.mark.timeout(120)
def test_example_trains_digits(capsys, monkeypatch):
    import runpy

    examples = os.path.join(os.path.dirname(HERE), "examples")
    monkeypatch.syspath_prepend(examples)  # it imports train_digits, as `python examples/...` can
    main = runpy.run_path(os.path.join(examples, "train_digits_tpu.py"))["main"]
    accuracy = main(
        ["--cpu-devices", "0", "--replicas", "4", "--epochs", "2", "--steps-per-execution", "3"]
    )
    out = capsys.readouterr().out
    assert "TPUStrategy: 4 replicas" in out and "epoch   2" in out
    assert accuracy >= 0.9, out


# Without JAX, and in a fresh interpreter --------------------------------------------------------

NO_JAX_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["jax"] = None  # as if JAX were not installed
    import numpy as np
    import pycollective
    from pycollective import strategies as ds
    s = ds.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = s.run(lambda: ds.get_replica_context().all_reduce("SUM", np.ones(2)))
    assert np.asarray(s.experimental_local_results(out)[0]).tolist() == [2.0, 2.0]
    try:
        ds.TPUStrategy()
    except ImportError as exc:
        assert "pycollective[tpu]" in str(exc), exc
        print("OK", exc)
    else:
        raise SystemExit("TPUStrategy() without JAX did not raise")
""")


def test_without_jax_the_rest_works_and_tpu_strategy_names_the_extra():
    proc = subprocess.run(
        [sys.executable, "-c", NO_JAX_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


@needs_jax
def test_a_jax_without_shard_map_is_refused_by_name(monkeypatch):
    from pycollective.strategies.tpu import _jax

    monkeypatch.delattr(jax.lax, "pcast")
    with pytest.raises(ImportError, match="newer JAX.*jax.lax.pcast"):
        _jax.require()


@needs_jax
@pytest.mark.timeout(240)
def test_rerun_in_fresh_process():
    if WHY_NOT is None:
        pytest.skip("this process has the forced devices; the tests above ran here")
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
        JAX_PLATFORMS="cpu",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            os.path.abspath(__file__),
            "-k",
            "not rerun and not processes",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, proc.stdout[-3000:]


# Several processes -------------------------------------------------------------------------------

WORKER_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    import numpy as np
    from pycollective import strategies as ds
    import tpu_models as tm

    s = ds.TPUStrategy()
    rank = s.cluster_resolver.task_id
    assert s.num_replicas_in_sync == 4 and s.extended._num_local_replicas == 2, s
    x, y = tm.digits(128)
    batches = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 128, 64)]
    p0 = tm.init_params()
    got, variables, opt = tm.strategy_train(ds, s, p0, batches, "adam", 0.01)
    want = tm.reference_train(p0, batches, "adam", 0.01)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-6, err_msg=k)
    out = s.run(lambda: ds.get_replica_context().replica_id_in_sync_group * 1.0)
    assert float(s.reduce("SUM", out)) == 6.0
    ids = [float(c) for c in s.experimental_local_results(out)]
    assert ids == [2.0 * rank, 2.0 * rank + 1], ids
    path = ds.Checkpoint(model=variables, opt=opt).write(os.path.join({tmp!r}, "mp.npz"))
    print(f"OK process {{rank}}", flush=True)
""")


@needs_jax
@pytest.mark.timeout(150)
def test_two_processes_with_pycollective_run_form_one_mesh(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT.format(here=HERE, tmp=str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
        PYCOLLECTIVE_TIMEOUT="30",
    )
    # Its own process group, so that a timeout stops the launcher and the workers it started
    # (they die with it), well before the test's timeout mark (150 s).
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pycollective.cli",
            "run",
            "-n",
            "2",
            "--timeout",
            "100",
            sys.executable,
            str(script),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(tmp_path),
        **in_own_process_group(),
    )
    [output] = _communicate_all([proc], deadline=time.monotonic() + 120)
    assert proc.returncode == 0, output[-6000:]
    assert "OK process 0" in output and "OK process 1" in output, output[-6000:]
    # the chief wrote a checkpoint that MirroredStrategy reads
    mirrored = ds.MirroredStrategy(["/cpu:0"])
    with mirrored.scope():
        variables = {k: ds.Variable(np.zeros_like(v), name=k) for k, v in tm.init_params().items()}
    ds.Checkpoint(model=variables).restore(str(tmp_path / "mp.npz"))
    assert not np.allclose(variables["w1"].numpy(), 0)


LIGHT_SCRIPT = textwrap.dedent("""
    import numpy as np
    from pycollective import strategies as ds

    s = ds.TPUStrategy()
    rank = s.cluster_resolver.task_id
    assert s.num_replicas_in_sync == 2 and s.extended._num_local_replicas == 1, s
    with s.scope():
        w = ds.Variable(np.zeros(2, np.float32))
        opt = ds.SGD(1.0)
        # initial values that differ by process (an unseeded init): process 0's everywhere
        differ = ds.Variable(np.full(3, rank + 1.0, np.float32))
    assert differ.numpy().tolist() == [1.0, 1.0, 1.0], differ.numpy()
    def step(x):
        opt.apply_gradients([(x[0], w)])
        return ds.get_replica_context().all_reduce("SUM", x[0])
    batch = next(iter(s.experimental_distribute_dataset([np.array([[1, 2], [3, 4]], np.float32)])))
    total = s.run(step, args=(batch,))
    assert [np.asarray(c).tolist() for c in s.experimental_local_results(total)] == [[4, 6]]
    assert w.numpy().tolist() == [-2, -3], w.numpy()
    # one replica per process: a plain value is that replica's (every strategy's rule)
    assert float(np.asarray(s.reduce("SUM", np.float32(rank + 1)))) == 3.0
    assert float(np.asarray(s.reduce("MEAN", np.float32(rank + 1)))) == 1.5
    # per-replica values of different sizes in each process: both pad to the most rows of
    # either (each padding to its own would build two programs of different shapes: a hang)
    uneven = s.experimental_distribute_values_from_function(
        lambda ctx: np.ones((3 if rank == 0 else 1, 2), np.float32))
    ctx = ds.get_replica_context
    sums = s.run(lambda v: ctx().all_gather(v, axis=0).sum() + 0 * ctx().experimental_valid_rows,
                 args=(uneven,))
    assert float(np.asarray(s.reduce("SUM", sums))) == 16.0  # 8 on each replica
    print(f"OK process {rank}", flush=True)
""")


def _communicate_all(procs: list[subprocess.Popen], deadline: float) -> list[str]:
    """The output of each process (each in a process group of its own), waiting for all
    of them until one shared ``deadline`` (time.monotonic()). Whatever still runs then, or when
    waiting fails, is stopped with its whole process group (SIGTERM, then SIGKILL)."""
    outputs = [""] * len(procs)
    try:
        for i, p in enumerate(procs):
            try:
                outputs[i] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                break
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in procs if p.poll() is None]
            for p in alive:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            for p in alive:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
    for i, p in enumerate(procs):
        if not outputs[i] and p.stdout is not None:
            try:
                outputs[i] = p.communicate(timeout=5)[0] or ""
            except (subprocess.TimeoutExpired, ValueError):
                pass
        if p.returncode is None or p.returncode < 0:
            outputs[i] += f"\n[stopped at the deadline: returncode {p.returncode}]"
    return outputs


@needs_jax
@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["torchrun", "tf_config"])
def test_two_processes_from_other_launchers_environments(tmp_path, launcher):
    from multiproc import reserve_ports

    script = tmp_path / "light.py"
    script.write_text(LIGHT_SCRIPT)
    reserved = reserve_ports(2)  # held until the processes are gone
    port, second_port = reserved.ports
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYCOLLECTIVE_") and k not in ("TF_CONFIG", "RANK", "WORLD_SIZE")
    }
    base.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    procs = []
    for rank in range(2):
        env = dict(base)
        if launcher == "torchrun":
            env.update(
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        else:
            env["TF_CONFIG"] = json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{second_port}"]},
                    "task": {"type": "worker", "index": rank},
                }
            )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                cwd=str(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                **in_own_process_group(),
            )
        )
    outputs = _communicate_all(procs, deadline=time.monotonic() + 70)  # mark: 90 s
    reserved.close()
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"OK process {rank}" in out, out[-4000:]
