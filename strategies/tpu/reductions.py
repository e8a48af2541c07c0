"""Cross-replica reductions of per-replica results, compiled by XLA on the devices."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reduce_util import ReduceOp
from . import _jax, step

_REDUCERS: dict[Any, Any] = {}


def _is_batch_axis(global_array: Any, axis: int | None) -> bool:
    """Whether ``axis`` of the per-replica values is their axis 0 (the padded batch axis)."""
    rank = global_array.ndim - 1
    return axis is not None and rank >= 1 and (axis == 0 or axis == -rank)


def _valid_mask(jnp: Any, x: Any, valid: Any) -> Any:
    """True at the real rows of ``x`` (replicas, rows, ...), broadcast to its shape."""
    mask = jnp.arange(x.shape[1])[None, :] < valid[:, None]
    return mask.reshape(mask.shape + (1,) * (x.ndim - 2))


def reduce_global(global_array: Any, op: ReduceOp, axis: int | None, valid: Any = None) -> Any:
    """Reduces the per-replica rows of ``global_array`` (replicas, ...). ``valid``: each
    replica's number of real rows on axis 0 (padded batches); a reduction along that axis
    leaves the padding out (a MEAN counts real rows only)."""
    jax = _jax.require()
    if valid is not None and _is_batch_axis(global_array, axis):
        fn = _REDUCERS.get(("reduce-valid", op))
        if fn is None:
            jnp = step.jnp()

            def reduce_valid(x: Any, n: Any) -> Any:
                total = jnp.sum(jnp.where(_valid_mask(jnp, x, n), x, 0), axis=(0, 1))
                if op == ReduceOp.MEAN:
                    total = total / jnp.sum(n)
                return total.astype(x.dtype)

            fn = _REDUCERS[("reduce-valid", op)] = jax.jit(reduce_valid)
        return jax.device_put(fn(global_array, valid), _replicated_like(global_array))
    key = ("reduce", op, axis)
    fn = _REDUCERS.get(key)
    if fn is None:
        jnp = step.jnp()

        def reduce(x: Any) -> Any:
            axes = (0,) if axis is None else (0, axis + 1 if axis >= 0 else x.ndim + axis)
            total = jnp.sum(x, axis=axes)
            if op == ReduceOp.MEAN:
                count = 1
                for a in axes:
                    count *= x.shape[a]
                total = total / count
            return total.astype(x.dtype)

        fn = _REDUCERS[key] = jax.jit(reduce)
    out = fn(global_array)
    return jax.device_put(out, _replicated_like(global_array))


def gather_global(global_array: Any, axis: int, valid: Any = None) -> Any:
    """Concatenates the per-replica rows of ``global_array`` along ``axis``. ``valid``: each
    replica's number of real rows on axis 0; gathered along it, the padding is left out."""
    jax = _jax.require()
    if valid is not None and _is_batch_axis(global_array, axis):
        return _gather_valid(global_array, valid)
    key = ("gather", axis)
    fn = _REDUCERS.get(key)
    if fn is None:
        jnp = step.jnp()

        def gather(x: Any) -> Any:
            if not -(x.ndim - 1) <= axis < x.ndim - 1:
                raise ValueError(
                    f"gather along axis {axis}: the per-replica values have shape "
                    f"{x.shape[1:]} (rank {x.ndim - 1}); gather needs an axis of "
                    "them (scalars cannot be concatenated)"
                )
            a = axis if axis >= 0 else x.ndim - 1 + axis
            moved = jnp.moveaxis(x, 0, a)  # (..., replicas, rows, ...)
            shape = moved.shape[:a] + (moved.shape[a] * moved.shape[a + 1],) + moved.shape[a + 2 :]
            return moved.reshape(shape)

        fn = _REDUCERS[key] = jax.jit(gather)
    return jax.device_put(fn(global_array), _replicated_like(global_array))


def _gather_valid(global_array: Any, valid: Any) -> Any:
    jax = _jax.require()
    jnp = step.jnp()
    replicated = _replicated_like(global_array)
    count = _REDUCERS.get("count")
    if count is None:
        count = _REDUCERS["count"] = jax.jit(jnp.sum)
    total = int(np.asarray(jax.device_put(count(valid), replicated)))  # the output's size
    key = ("gather-valid", total)
    fn = _REDUCERS.get(key)
    if fn is None:

        def gather(x: Any, n: Any) -> Any:
            rows = x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])
            keep = (jnp.arange(x.shape[1])[None, :] < n[:, None]).reshape(-1)
            return rows[jnp.nonzero(keep, size=total)[0]]

        fn = _REDUCERS[key] = jax.jit(gather)
    return jax.device_put(fn(global_array, valid), replicated)


def _replicated_like(global_array: Any) -> Any:
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(global_array.sharding.mesh, PartitionSpec())


def first_row(global_array: Any) -> Any:
    """Global replica 0's row, replicated (works when that row lives in another process)."""
    jax = _jax.require()
    fn = _REDUCERS.get("first")
    if fn is None:
        fn = _REDUCERS["first"] = jax.jit(lambda x: x[0])
    return jax.device_put(fn(global_array), _replicated_like(global_array))
