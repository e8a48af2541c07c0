"""Synchronous training: N replicas give the parameters of single-replica training on the same
global batches; gradient buckets; optimizer slots stay mirrored."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective import strategies as ds

D, K = 12, 4  # features, classes


def cpus(n: int) -> list[str]:
    return [f"/cpu:{i}" for i in range(n)]


def make_data(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, D)).astype(np.float32)
    true_w = rng.normal(size=(D, K)).astype(np.float32)
    y = np.argmax(x @ true_w + 0.5 * rng.normal(size=(rows, K)), axis=1)
    return x, y


def batches(x, y, batch):
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def grads(w, b, x, y, scale):
    """Softmax cross-entropy gradients of sum(loss) / scale."""
    logits = x @ w + b
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    d = (p / np.float32(scale)).astype(np.float32)
    return x.T @ d, d.sum(axis=0)


class Reference:
    """Single-replica training in plain numpy with the Keras optimizer formulas."""

    def __init__(self, kind, lr, **kw):
        self.kind, self.lr, self.kw = kind, lr, kw
        self.state = {}
        self.t = 0

    def step(self, params, gs):
        self.t += 1
        for name, g in gs.items():
            p = params[name]
            if self.kind == "sgd":
                mom = self.kw.get("momentum", 0.0)
                if mom == 0:
                    p -= self.lr * g
                    continue
                m = self.state.setdefault(name, np.zeros_like(p))
                m[...] = mom * m - self.lr * g
                p += (mom * m - self.lr * g) if self.kw.get("nesterov") else m
            else:
                b1, b2, eps = 0.9, 0.999, 1e-7
                m = self.state.setdefault(name + "/m", np.zeros_like(p))
                v = self.state.setdefault(name + "/v", np.zeros_like(p))
                alpha = self.lr * np.sqrt(1 - b2**self.t) / (1 - b1**self.t)
                m += (g - m) * (1 - b1)
                v += (g * g - v) * (1 - b2)
                p -= alpha * m / (np.sqrt(v) + eps)


def init_params():
    rng = np.random.default_rng(42)
    return {"w": (0.1 * rng.normal(size=(D, K))).astype(np.float32), "b": np.zeros(K, np.float32)}


def train_reference(data, opt_kind, lr, epochs, loss_scale, **kw):
    params = init_params()
    ref = Reference(opt_kind, lr, **kw)
    for _ in range(epochs):
        for x, y in data:
            scale = len(x)  # the global batch's mean loss
            gw, gb = grads(params["w"], params["b"], x, y, scale)
            ref.step(params, {"w": gw, "b": gb})
    return params


def train_distributed(n, data, opt_kind, lr, epochs, loss_scale, **kw):
    strategy = ds.MirroredStrategy(cpus(n))
    start = init_params()
    with strategy.scope():
        w = ds.Variable(start["w"], name="w")
        b = ds.Variable(start["b"], name="b")
        if opt_kind == "sgd":
            opt = ds.SGD(lr, gradient_aggregation=loss_scale, **kw)
        else:
            opt = ds.Adam(lr, gradient_aggregation=loss_scale)

    def step(batch, global_size):
        x, y = batch
        # MEAN aggregation: each replica's mean loss; SUM: loss / global batch size.
        scale = max(len(x), 1) if loss_scale == "MEAN" else global_size
        gw, gb = grads(np.asarray(w), np.asarray(b), x, y, scale)
        opt.apply_gradients([(gw, w), (gb, b)])

    for _ in range(epochs):
        for (gx, _), dist in zip(data, strategy.experimental_distribute_dataset(data)):
            strategy.run(step, args=(dist, len(gx)))
    return strategy, opt, w, b


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "opt_kind, kw",
    [
        ("sgd", {"momentum": 0.9}),
        ("sgd", {"momentum": 0.9, "nesterov": True}),
        ("adam", {}),
    ],
    ids=["sgd-momentum", "sgd-nesterov", "adam"],
)
def test_mirrored_training_equals_single_replica_even_batches(n, opt_kind, kw):
    x, y = make_data(96)
    data = batches(x, y, 24)  # 24 splits evenly over 1, 2, 3 and 4 replicas
    lr = 0.05 if opt_kind == "sgd" else 0.01
    epochs = 6  # 24 steps
    ref = train_reference(data, opt_kind, lr, epochs, "MEAN", **kw)
    _, opt, w, b = train_distributed(n, data, opt_kind, lr, epochs, "MEAN", **kw)
    for var, name in ((w, "w"), (b, "b")):
        copies = [c.numpy() for c in var.values]
        for c in copies[1:]:
            np.testing.assert_array_equal(c, copies[0])  # replicas stay bitwise identical
        np.testing.assert_allclose(copies[0], ref[name], rtol=2e-4, atol=2e-5)
    assert int(opt.iterations.numpy()) == epochs * len(data)
    for var, slot, _ in opt._slot_order:
        vals = [c.numpy() for c in opt.get_slot(var, slot).values]
        assert all(np.array_equal(v, vals[0]) for v in vals)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_mirrored_training_uneven_final_batch_with_global_batch_scaling(n):
    x, y = make_data(100)
    data = batches(x, y, 24)  # the last global batch has 4 rows: uneven, some replicas empty
    ref = train_reference(data, "sgd", 0.1, 5, "SUM", momentum=0.5)
    _, _, w, b = train_distributed(n, data, "sgd", 0.1, 5, "SUM", momentum=0.5)
    np.testing.assert_allclose(w.numpy(), ref["w"], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(b.numpy(), ref["b"], rtol=2e-4, atol=2e-5)


@pytest.mark.timeout(30)
def test_gradients_are_fused_into_buckets():
    # float16 has no fused native update: the general path, one collective per bucket.
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        vs = [ds.Variable(np.zeros(512, np.float16), name=f"v{i}") for i in range(6)]  # 1 KiB
        big = ds.SGD(0.1)  # default 4 MiB buckets
        small = ds.SGD(0.1, bytes_per_pack=2048)
    backend = s.extended.backend

    def step(opt):
        opt.apply_gradients([(np.ones(512, np.float16), v) for v in vs])

    before = backend.call_counts["allreduce"]
    s.run(step, args=(big,))
    assert backend.call_counts["allreduce"] - before == 1
    before = backend.call_counts["allreduce"]
    s.run(step, args=(small,))
    assert backend.call_counts["allreduce"] - before == 3
    for v in vs:
        np.testing.assert_allclose(v.numpy(), np.full(512, -0.2), rtol=1e-3)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "make_opt",
    [
        lambda: ds.SGD(0.1),
        lambda: ds.SGD(0.1, momentum=0.9),
        lambda: ds.SGD(0.1, momentum=0.9, nesterov=True),
        lambda: ds.Adam(0.01),
    ],
    ids=["sgd", "momentum", "nesterov", "adam"],
)
def test_in_process_replicas_update_in_one_fused_pass(make_opt):
    # float32 state of in-process replicas: summed and applied by the native kernel, with no
    # collective at all, and the same result as the numpy arithmetic of the general path.
    rng = np.random.default_rng(5)
    grads = [[rng.standard_normal((40, 3)).astype(np.float32) for _ in range(2)] for _ in range(3)]
    results = {}
    for dtype in (np.float32, np.float64):  # both have the fused kernel
        s = ds.MirroredStrategy(cpus(3))
        with s.scope():
            vs = [ds.Variable(np.ones((40, 3), dtype), name=f"w{i}") for i in range(2)]
            opt = make_opt()
        before = s.extended.backend.call_counts["allreduce"]

        def step(opt=opt, dtype=dtype, vs=vs):
            mine = grads[ds.get_replica_context().replica_id_in_sync_group]
            opt.apply_gradients(zip([g.astype(dtype) for g in mine], vs))

        for _ in range(3):
            s.run(step)
        assert s.extended.backend.call_counts["allreduce"] == before
        for v in vs:
            copies = s.experimental_local_results(v)
            for c in copies[1:]:
                np.testing.assert_array_equal(c, copies[0])
        results[dtype] = [v.numpy() for v in vs]
    # The reference: the general path's numpy arithmetic on one copy, with the mean gradient.
    ref_opt = make_opt()
    for i in range(2):
        w = np.ones((40, 3), np.float64)
        slots = {name: np.zeros_like(w) for name in ref_opt.get_slot_names()}
        mean = np.mean([grads[r][i].astype(np.float64) for r in range(3)], axis=0)
        for step in range(3):
            ref_opt._update_step(w, mean, slots, ref_opt._lr(step), step)
        np.testing.assert_allclose(results[np.float64][i], w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(results[np.float32][i], w, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(30)
def test_sync_on_read_copies_are_updated_each_on_its_own():
    # The fused kernel computes from copy 0: only mirrored state may take it.
    s = ds.MirroredStrategy(cpus(3))
    with s.scope():
        v = ds.Variable(np.zeros(4, np.float32), synchronization="on_read", aggregation="sum")
        opt = ds.SGD(0.1)
    s.run(
        lambda: v.assign(
            np.full(4, float(ds.get_replica_context().replica_id_in_sync_group + 1), np.float32)
        )
    )
    s.run(lambda: opt.apply_gradients([(np.ones(4, np.float32), v)]))
    copies = [np.asarray(c) for c in s.experimental_local_results(v)]
    for r, c in enumerate(copies):
        np.testing.assert_allclose(c, np.full(4, r + 1 - 0.1), rtol=1e-6)


@pytest.mark.timeout(30)
def test_a_subclass_update_step_is_not_bypassed():
    class ClippedSGD(ds.SGD):
        def _update_step(self, var, grad, slots, lr, step):
            super()._update_step(var, np.clip(grad, -1, 1), slots, lr, step)

    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        v = ds.Variable(np.zeros(3, np.float32))
        opt = ClippedSGD(0.5)
    s.run(lambda: opt.apply_gradients([(np.full(3, 10.0, np.float32), v)]))
    np.testing.assert_allclose(v.numpy(), np.full(3, -0.5))


@pytest.mark.timeout(30)
def test_apply_gradients_in_cross_replica_context():
    s = ds.MirroredStrategy(cpus(3))
    with s.scope():
        w = ds.Variable(np.zeros(3, np.float32))
        b = ds.Variable(np.zeros(1, np.float32))
        opt = ds.SGD(1.0, momentum=0.5)
    per_replica = s.run(
        lambda: np.full(3, ds.get_replica_context().replica_id_in_sync_group, np.float32)
    )
    before = s.extended.backend.call_counts["allreduce"]
    opt.apply_gradients([(per_replica, w), (np.ones(1, np.float32), b)])
    assert s.extended.backend.call_counts["allreduce"] - before == 1
    np.testing.assert_allclose(w.numpy(), np.full(3, -1.0))  # MEAN of 0, 1, 2
    np.testing.assert_allclose(b.numpy(), [-1.0])
    assert all(np.array_equal(c.numpy(), w.numpy()) for c in w.values)
    assert opt.get_slot_names() == ["momentum"]
    np.testing.assert_allclose(opt.get_slot(w, "momentum").numpy(), np.full(3, -1.0))
    assert int(opt.iterations.numpy()) == 1


@pytest.mark.timeout(30)
def test_optimizer_options_and_errors():
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        w = ds.Variable(np.zeros(2, np.float32))
        opt = ds.SGD(lambda step: 1.0 / (step + 1))  # a schedule
    for _ in range(3):
        s.run(lambda: opt.apply_gradients([(np.ones(2, np.float32), w), (None, w)]))
    np.testing.assert_allclose(w.numpy(), np.full(2, -(1 + 1 / 2 + 1 / 3)), rtol=1e-6)
    with pytest.raises(ValueError, match="momentum"):
        ds.SGD(momentum=2.0)
    with pytest.raises(ValueError, match="beta_1"):
        ds.Adam(beta_1=1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        ds.SGD(-1.0)
    with pytest.raises(TypeError, match="variables created by Variable"):
        opt.apply_gradients([(np.ones(2), np.zeros(2))])
    with pytest.raises(ValueError, match="gradient of .* has shape"):
        opt.apply_gradients([(np.ones(3), w)])
    with pytest.raises(KeyError, match="no slot"):
        opt.get_slot(w, "momentum")
    other = ds.MirroredStrategy(cpus(2))
    with other.scope():
        v2 = ds.Variable(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="one optimizer per strategy"):
        opt.apply_gradients([(np.ones(2), v2)])
    adam = ds.Adam(0.1)
    adam.build([w])
    assert sorted(s_ for _, s_, _ in adam._slot_order) == ["m", "v"]
    assert len(adam.variables()) == 3


@pytest.mark.timeout(60)
def test_torch_training_step():
    torch = pytest.importorskip("torch")
    s = ds.MirroredStrategy(cpus(2))
    with s.scope():
        w = ds.Variable(np.zeros(3, np.float32), name="w")
        opt = ds.SGD(0.5)
    target = torch.tensor([1.0, -2.0, 3.0])

    def step(x):
        wt = torch.from_numpy(np.asarray(w).copy()).requires_grad_(True)
        loss = ((x @ wt - x @ target) ** 2).mean()
        loss.backward()
        opt.apply_gradients([(wt.grad, w)])
        return loss.detach()

    rng = np.random.default_rng(0)
    data = [torch.from_numpy(rng.normal(size=(8, 3)).astype(np.float32)) for _ in range(60)]
    for batch in s.experimental_distribute_dataset(data):
        loss = s.reduce("MEAN", s.run(step, args=(batch,)), axis=None)
    assert isinstance(loss, torch.Tensor) and float(loss) < 1e-3
    np.testing.assert_allclose(w.numpy(), target.numpy(), atol=1e-2)
