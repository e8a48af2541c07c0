"""numpy references for every collective and op, and the tolerance rules per dtype.

Floating results are compared against a float64 computation; the error bound grows with the
number of replicas (each partial result rounds once). Integers, min and max must match exactly.
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

ALL_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}


def np_dtype(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def make_inputs(dtype: str, op: str, n: int, count: int, seed: int) -> list[np.ndarray]:
    """Per-replica inputs that keep products bounded and make every replica distinguishable."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    if dtype in FLOATS:
        if op == "prod":
            vals = [rng.uniform(0.5, 1.5, count) for _ in range(n)]
        else:
            vals = [rng.uniform(-1, 1, count) for _ in range(n)]
        return [v.astype(dt) for v in vals]
    info = np.iinfo(dt)
    lo, hi = (max(info.min, -3), min(info.max, 3)) if op == "prod" else (info.min, info.max)
    return [rng.integers(lo, hi, count, endpoint=True).astype(dt) for _ in range(n)]


def reduce_ref(xs: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction of xs as numpy computes it (integers wrap like numpy's)."""
    dt = xs[0].dtype
    if dt.kind == "f" or dt == BF16:
        stack = np.stack([x.astype(np.float64) for x in xs])
        res = {
            "sum": lambda s: s.sum(0),
            "prod": lambda s: s.prod(0),
            "min": lambda s: s.min(0),
            "max": lambda s: s.max(0),
            "avg": lambda s: s.sum(0) / len(xs),
        }[op](stack)
        return res.astype(dt)
    stack = np.stack(xs)
    with np.errstate(over="ignore"):
        if op == "sum":
            return stack.sum(0, dtype=dt)
        if op == "prod":
            return stack.prod(0, dtype=dt)
        if op == "min":
            return stack.min(0)
        if op == "max":
            return stack.max(0)
    raise ValueError(op)


def assert_close(got: np.ndarray, want: np.ndarray, op: str, n: int, what: str = "") -> None:
    """Exact for integers, min and max; within a rounding bound for floating sums/products."""
    dt = want.dtype
    exact = not (dt.kind == "f" or dt == BF16) or op in ("min", "max")
    g = np.asarray(got)
    assert g.shape == want.shape, f"{what}: shape {g.shape} != {want.shape}"
    if exact:
        assert np.array_equal(
            g.view(np.uint8) if dt == BF16 else g, want.view(np.uint8) if dt == BF16 else want
        ), f"{what}: not exact"
        return
    eps = {
        np.dtype(np.float16): 2**-10,
        np.dtype(np.float32): 2**-23,
        np.dtype(np.float64): 2**-52,
    }.get(np.dtype(dt), 2**-7)
    tol = 4 * max(n, 2) * eps
    gf, wf = g.astype(np.float64), want.astype(np.float64)
    bound = tol * np.maximum(1.0, np.abs(wf)) * (n if op in ("sum", "avg") else 1)
    bad = np.abs(gf - wf) > bound
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} elements off, e.g. got {gf[bad][:3]} want {wf[bad][:3]}"
    )
