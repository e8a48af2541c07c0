"""Cross-replica reductions of per-replica results, compiled by XLA on the devices."""

from __future__ import annotations

from typing import Any

from ..reduce_util import ReduceOp
from . import _jax, step

_REDUCERS: dict[Any, Any] = {}


def reduce_global(global_array: Any, op: ReduceOp, axis: int | None) -> Any:
    jax = _jax.require()
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


def gather_global(global_array: Any, axis: int) -> Any:
    jax = _jax.require()
    key = ("gather", axis)
    fn = _REDUCERS.get(key)
    if fn is None:
        jnp = step.jnp()

        def gather(x: Any) -> Any:
            if not -(x.ndim - 1) <= axis < x.ndim - 1:
                raise ValueError(f"gather along axis {axis}: the per-replica values have shape "
                                 f"{x.shape[1:]} (rank {x.ndim - 1}); gather needs an axis of "
                                 "them (scalars cannot be concatenated)")
            a = axis if axis >= 0 else x.ndim - 1 + axis
            moved = jnp.moveaxis(x, 0, a)  # (..., replicas, rows, ...)
            shape = moved.shape[:a] + (moved.shape[a] * moved.shape[a + 1],) + moved.shape[a + 2:]
            return moved.reshape(shape)

        fn = _REDUCERS[key] = jax.jit(gather)
    return jax.device_put(fn(global_array), _replicated_like(global_array))


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
