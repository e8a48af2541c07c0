"""Distributed variables: creation, aggregation rules in replica and cross-replica context,
sync-on-read metrics, components, and checkpoints across replica counts."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pycollective import strategies as ds

Agg = ds.VariableAggregation
Sync = ds.VariableSynchronization


def cpus(n: int) -> list[str]:
    return [f"/cpu:{i}" for i in range(n)]


def rid() -> int:
    return ds.get_replica_context().replica_id_in_sync_group


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}rep")
def strategy(request):
    return ds.MirroredStrategy(cpus(request.param))


def copies(var):
    return [c.numpy() for c in var.values]


# Creation -------------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_variables_created_in_scope_are_mirrored(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ds.Variable(lambda: np.arange(3, dtype=np.float32), name="v")
        m = ds.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM, name="m")
    assert isinstance(v, ds.MirroredVariable) and isinstance(v, ds.Variable)
    assert isinstance(v, ds.DistributedValues)
    assert isinstance(m, ds.SyncOnReadVariable) and not m.trainable and v.trainable
    assert len(v.values) == n and v.shape == (3,) and v.dtype == np.float32 and v.name == "v"
    assert v.distribute_strategy is strategy and v.synchronization == Sync.ON_WRITE
    for c in copies(v):
        np.testing.assert_array_equal(c, np.arange(3))
    # Copies are independent buffers.
    assert len({id(np.asarray(c)) for c in v.values}) == n
    # Arithmetic reads the variable.
    np.testing.assert_array_equal(v + 1, np.arange(1, 4))
    np.testing.assert_array_equal(np.ones((2, 3)) @ v, [3.0, 3.0])
    assert float(m) == 0.0


@pytest.mark.timeout(20)
def test_variable_outside_scope_belongs_to_the_default_strategy():
    v = ds.Variable(np.ones(2), aggregation="sum")
    assert v.distribute_strategy is ds.get_strategy() and len(v.values) == 1
    v.assign_add(np.ones(2))
    np.testing.assert_array_equal(v.numpy(), [2.0, 2.0])


@pytest.mark.timeout(20)
def test_variable_creation_errors():
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        with pytest.raises(ValueError, match="only for non-trainable"):
            ds.Variable(0.0, trainable=True, synchronization=Sync.ON_READ)
        with pytest.raises(ValueError, match="NONE is not supported"):
            ds.Variable(0.0, synchronization=Sync.NONE)
        with pytest.raises(ValueError, match="aggregation must be one of"):
            ds.Variable(0.0, aggregation="median")
        with pytest.raises(ValueError, match="shape"):
            ds.Variable(np.zeros(2), shape=(3,))
    with pytest.raises(RuntimeError, match="not inside strategy.run"):
        s.run(lambda: ds.Variable(0.0))


# Mirrored: replica-context aggregation -------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "agg, expect",
    [
        (Agg.SUM, lambda n: 10 + sum(range(1, n + 1))),
        (Agg.MEAN, lambda n: 10 + sum(range(1, n + 1)) / n),
        (Agg.ONLY_FIRST_REPLICA, lambda n: 10 + 1),
    ],
)
def test_assign_add_aggregation(strategy, agg, expect):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ds.Variable(np.full(2, 10.0), aggregation=agg)
    strategy.run(lambda: v.assign_add(np.full(2, rid() + 1.0)))
    for c in copies(v):
        np.testing.assert_allclose(c, np.full(2, expect(n)))


@pytest.mark.timeout(20)
def test_assign_and_assign_sub_aggregation(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        s = ds.Variable(np.zeros(2), aggregation=Agg.SUM)
        m = ds.Variable(np.zeros(2), aggregation=Agg.MEAN)

    def fn():
        s.assign(np.full(2, rid() + 1.0))
        m.assign_sub(np.full(2, 2.0 * rid()))
        return s.read_value(), m.read_value()

    sv, _ = strategy.run(fn)
    for c in strategy.experimental_local_results(sv):  # every replica reads the update
        np.testing.assert_allclose(c, np.full(2, n * (n + 1) / 2))
    np.testing.assert_allclose(copies(m)[-1], np.full(2, -(n - 1.0)))


@pytest.mark.timeout(20)
def test_aggregation_none_allows_identical_values_and_refuses_different_ones():
    s = ds.MirroredStrategy(cpus(3))
    with s.scope():
        v = ds.Variable(np.zeros(2), name="step_size")
    s.run(lambda: v.assign(np.full(2, 4.0)))
    assert all(np.array_equal(c, [4.0, 4.0]) for c in copies(v))
    with pytest.raises(ValueError, match="'step_size' has aggregation NONE.*different values"):
        s.run(lambda: v.assign(np.full(2, float(rid()))))
    assert all(np.array_equal(c, [4.0, 4.0]) for c in copies(v))  # nothing was applied


@pytest.mark.timeout(20)
def test_replica_updates_must_all_happen():
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(0.0, aggregation=Agg.SUM)
    with pytest.raises(
        ds.ReplicaFailed,
        match="returned from its replica function without calling assign_add of variable",
    ):
        s.run(lambda: v.assign_add(1.0) if rid() == 0 else None)


@pytest.mark.timeout(20)
def test_reads_inside_run_see_the_own_copy():
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(np.zeros(2))
    s.extended.update(v, lambda c: c.assign(np.full(2, float(c.name[-1]))))
    got = s.run(lambda: (v.value().copy(), np.asarray(v).copy(), v.numpy()))
    for k in range(3):
        assert [float(x[0]) for x in s.experimental_local_results(got[k])] == [0.0, 1.0]
    ro = s.run(lambda: v.value())
    assert not ro.values[0].flags.writeable
    assert v.read_value()[0] == 0.0  # cross-replica: the primary copy


# Mirrored: cross-replica updates --------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_cross_replica_assign_updates_every_copy(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ds.Variable(np.zeros(2), aggregation=Agg.SUM)
        v.assign(np.ones(2))
        v.assign_add(np.ones(2))
        v.assign_sub(np.full(2, 0.5))
    assert all(np.array_equal(c, [1.5, 1.5]) for c in copies(v))
    pr = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group + 1.0)
    )
    v.assign(pr)  # SUM aggregation combines a PerReplica value
    assert all(np.allclose(c, n * (n + 1) / 2) for c in copies(v))
    with strategy.scope():
        w = ds.Variable(np.zeros(2))
    if n > 1:
        with pytest.raises(ValueError, match="PerReplica value"):
            w.assign(pr)
    with pytest.raises(ValueError, match="shape"):
        v.assign(np.zeros(3))


@pytest.mark.timeout(20)
def test_torch_values_and_shared_memory():
    torch = pytest.importorskip("torch")
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(torch.zeros(3), aggregation=Agg.MEAN)
    views = [torch.from_numpy(np.asarray(c)) for c in v.values]
    s.run(lambda: v.assign_add(torch.full((3,), float(rid()))))
    for t in views:  # the variable was updated in place
        assert torch.allclose(t, torch.full((3,), 0.5))


# Sync on read ---------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_sync_on_read_metrics(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        total = ds.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM)
        mean = ds.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.MEAN)
        first = ds.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.ONLY_FIRST_REPLICA)
    backend = strategy.extended.backend
    before = backend.call_counts["allreduce"]

    def fn():
        total.assign_add(rid() + 1.0)
        mean.assign(float(rid()))
        first.assign(rid() + 5.0)
        return total.read_value()  # a replica reads its own copy

    own = strategy.run(fn)
    assert backend.call_counts["allreduce"] == before  # replica updates never communicate
    assert [float(x) for x in strategy.experimental_local_results(own)] == [
        r + 1.0 for r in range(n)
    ]
    assert float(total.read_value()) == n * (n + 1) / 2
    assert float(mean.read_value()) == pytest.approx((n - 1) / 2)
    assert float(first.read_value()) == 5.0
    assert float(strategy.reduce("SUM", total, axis=None)) == n * (n + 1) / 2
    # Reset as Keras metrics do: assign in cross-replica context.
    total.assign(0.0)
    assert float(total.read_value()) == 0.0
    total.assign(6.0)  # spread so that the sum reads 6
    assert float(total.read_value()) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="does not support `assign_add` in cross-replica"):
        total.assign_add(1.0)
    mean.assign_add(1.0)  # MEAN: every copy
    assert float(mean.read_value()) == pytest.approx((n - 1) / 2 + 1)


@pytest.mark.timeout(20)
def test_sync_on_read_none_aggregation_cannot_be_read_cross_replica():
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(0.0, synchronization=Sync.ON_READ)
    s.run(lambda: v.assign(1.0))
    with pytest.raises(ValueError, match="aggregation is NONE"):
        v.read_value()


# Checkpoints ----------------------------------------------------------------------------------------


class Model:
    def __init__(self, n_in, n_out):
        self.kernel = ds.Variable(
            np.random.default_rng(0).normal(size=(n_in, n_out)).astype(np.float32), name="kernel"
        )
        self.bias = ds.Variable(np.zeros(n_out, np.float32), name="bias")
        self.metric = ds.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM)
        self._private = ds.Variable(1.0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("save_n, restore_n", [(2, 3), (3, 1), (1, 4)])
def test_checkpoint_restores_under_another_replica_count(tmp_path, save_n, restore_n):
    s1 = ds.MirroredStrategy(cpus(save_n))
    with s1.scope():
        model = Model(4, 3)
        opt = ds.Adam(0.1)
        step = ds.Variable(np.int64(0), aggregation=Agg.ONLY_FIRST_REPLICA)

    def train():
        g = np.full((4, 3), rid() + 1.0, np.float32)
        opt.apply_gradients([(g, model.kernel), (np.ones(3, np.float32), model.bias)])
        model.metric.assign_add(1.0)
        step.assign_add(1)

    s1.run(train)
    s1.run(train)
    ckpt = ds.Checkpoint(model=model, optimizer=opt, step=step)
    path = ckpt.save(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt-1.npz") and os.path.exists(path)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    with np.load(path, allow_pickle=False) as data:
        keys = set(data.files)
    assert {
        "model/kernel",
        "model/bias",
        "model/metric",
        "step",
        "optimizer/iterations",
        "optimizer/slots/model/kernel/m",
        "optimizer/slots/model/bias/v",
    } <= keys
    assert not any("_private" in k for k in keys)

    s2 = ds.MirroredStrategy(cpus(restore_n))
    with s2.scope():
        model2 = Model(4, 3)
        model2.kernel.assign(np.zeros((4, 3), np.float32))
        opt2 = ds.Adam(0.1)
        step2 = ds.Variable(np.int64(0), aggregation=Agg.ONLY_FIRST_REPLICA)
    status = ds.Checkpoint(model=model2, optimizer=opt2, step=step2).restore(path)
    status.assert_consumed()
    for a, b in [(model.kernel, model2.kernel), (model.bias, model2.bias)]:
        for c in copies(b):
            np.testing.assert_array_equal(c, a.numpy())
    assert float(model2.metric.read_value()) == pytest.approx(2.0 * save_n)
    assert int(step2.numpy()) == 2 and int(opt2.iterations.numpy()) == 2
    for name in ("m", "v"):
        for c in copies(opt2.get_slot(model2.kernel, name)):
            np.testing.assert_array_equal(c, opt.get_slot(model.kernel, name).numpy())

    # Continuing training from the restored state matches continuing the original.
    s1.run(train)

    def train2():
        g = np.full((4, 3), 0.0, np.float32) + np.float32(np.mean([r + 1.0 for r in range(save_n)]))
        opt2.apply_gradients(
            [(g, model2.kernel), (np.ones(3, np.float32), model2.bias)],
            skip_gradients_aggregation=True,
        )

    s2.run(train2)
    np.testing.assert_allclose(model2.kernel.numpy(), model.kernel.numpy(), rtol=1e-6)


@pytest.mark.timeout(20)
def test_checkpoint_write_read_and_errors(tmp_path):
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(np.arange(3.0), name="v")
        w = ds.Variable(np.zeros(2), name="w")
    ck = ds.Checkpoint(v=v, extra={"w": w})
    p = ck.write(str(tmp_path / "sub" / "exact.npz"))
    assert p.endswith("exact.npz") and os.path.exists(p)
    v.assign(np.zeros(3))
    ck.read(p).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), np.arange(3.0))
    # Partial restores are reported.
    status = ds.Checkpoint(v=v).restore(p)
    assert status.unused == ["extra/w"]
    with pytest.raises(AssertionError, match="unused"):
        status.assert_consumed()
    missing = ds.Checkpoint(v=v, z=w).restore(p)
    assert missing.missing == ["z"]
    with s.scope():
        bad = ds.Variable(np.zeros(4), name="v")
    with pytest.raises(ValueError, match="has shape \\(3,\\), but the variable has shape"):
        ds.Checkpoint(v=bad).restore(p)
    np.savez(tmp_path / "foreign.npz", v=np.zeros(3))
    with pytest.raises(ValueError, match="not a pycollective.strategies checkpoint"):
        ds.Checkpoint(v=v).restore(str(tmp_path / "foreign.npz"))
    # A pickled object array is never loaded.
    np.savez(tmp_path / "evil.npz", _CHECKPOINT_FORMAT=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        ds.Checkpoint(v=v).restore(str(tmp_path / "evil.npz"))
    with pytest.raises(RuntimeError, match="outside strategy.run"):
        s.run(lambda: ck.write(str(tmp_path / "x.npz")))
    with pytest.raises(ValueError, match="checkpoint name"):
        ds.Checkpoint(**{"a/b": v})


@pytest.mark.timeout(20)
def test_checkpoint_save_counter_and_latest(tmp_path):
    from pycollective.strategies.checkpoint import latest_checkpoint

    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(0.0)
    ck = ds.Checkpoint(v=v)
    for i in range(3):
        v.assign(float(i))
        last = ck.save(str(tmp_path / "run"))
    assert last.endswith("run-3.npz") and latest_checkpoint(str(tmp_path)) == last
    v.assign(-1.0)
    ck2 = ds.Checkpoint(v=v)
    ck2.restore(last)
    assert float(v.numpy()) == 2.0 and ck2.save_counter == 3
