"""Shared by the TPUStrategy tests (and their worker processes): the digits MLP in JAX, a
single-device reference trainer written independently of pycollective's optimizers, and the
same training under a TPUStrategy."""

from __future__ import annotations

import numpy as np

SIZES = (64, 32, 10)


def digits(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``rows`` of scikit-learn's digits: features in [0, 1] (float32), labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x[:rows] / 16.0).astype(np.float32), y[:rows].astype(np.int32)


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_in, n_hidden, n_out = SIZES
    return {
        "w1": (rng.normal(size=(n_in, n_hidden)) * 0.3).astype(np.float32),
        "b1": np.zeros(n_hidden, np.float32),
        "w2": (rng.normal(size=(n_hidden, n_out)) * 0.3).astype(np.float32),
        "b2": np.zeros(n_out, np.float32),
    }


def losses(params, x, y):
    """Per-example softmax cross-entropy of the MLP (jax.numpy)."""
    import jax
    import jax.numpy as jnp

    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1)[:, 0]


def reference_train(params, batches, opt: str, lr: float, momentum: float = 0.9):
    """One device, whole global batches: gradient of the mean loss, then Keras's SGD-momentum
    or Adam formulas in numpy (float32)."""
    import jax
    import jax.numpy as jnp

    params = {k: v.copy() for k, v in params.items()}
    state = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in params.items()}
    grad_fn = jax.jit(jax.grad(lambda p, x, y: jnp.mean(losses(p, x, y))))
    for t, (x, y) in enumerate(batches, start=1):
        grads = {k: np.asarray(g) for k, g in grad_fn(params, x, y).items()}
        for k, g in grads.items():
            m, v = state[k]
            if opt == "sgd":
                m[...] = momentum * m - lr * g
                params[k] = params[k] + m
            else:
                b1, b2, eps = 0.9, 0.999, 1e-7
                m[...] = m + (g - m) * (1 - b1)
                v[...] = v + (g * g - v) * (1 - b2)
                alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
                params[k] = (params[k] - alpha * m / (np.sqrt(v) + eps)).astype(np.float32)
    return params


def make_optimizer(ds, opt: str, lr: float, **kwargs):
    return ds.SGD(lr, momentum=0.9, **kwargs) if opt == "sgd" else ds.Adam(lr, **kwargs)


def strategy_train(ds, strategy, params, batches, opt: str, lr: float):
    """The same training under ``strategy``: each replica's gradient of the mean loss over its
    share of the batch, averaged by apply_gradients (MEAN)."""
    import jax
    import jax.numpy as jnp

    with strategy.scope():
        variables = {k: ds.Variable(v, name=k) for k, v in params.items()}
        optimizer = make_optimizer(ds, opt, lr)

    def step(x, y):
        values = {k: v.value() for k, v in variables.items()}
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(losses(p, x, y)))(values)
        optimizer.apply_gradients([(grads[k], variables[k]) for k in sorted(variables)])
        return loss

    for x, y in strategy.experimental_distribute_dataset(batches):
        strategy.run(step, args=(x, y))
    return {k: v.numpy() for k, v in variables.items()}, variables, optimizer
