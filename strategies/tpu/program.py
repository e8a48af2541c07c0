"""One compiled replica step (or block of steps) per input signature.

``prepare`` places a call's arguments on the mesh (per-replica values sharded, row r on
replica r's device; arrays replicated; other Python values kept as constants of the program)
and computes the signature that selects the program. ``Program`` builds
``jax.jit(jax.shard_map(...))`` over the traced replica function (:mod:`.step`), runs it, and
writes the variables' new values back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _nest, _tensors
from ..values import DistributedValues
from ..variables import DistributedVariable
from . import _jax, step
from .values import PaddedPerReplica, TPUPerReplica

if TYPE_CHECKING:
    from .strategy import TPUExtended
    from .variables import TPUMirroredVariable


def host_array(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if _tensors.is_torch(x):
        return _tensors.to_numpy(x)
    return np.asarray(x)


def canonical(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        jax = _jax.require()
        return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)
    return x


def _is_array(x: Any) -> bool:
    if isinstance(x, (np.ndarray, np.generic)) or _tensors.is_torch(x):
        return True
    jax = _jax.require()
    return isinstance(x, jax.Array)


class Prepared:
    """One call's inputs, placed on the mesh, and the signature that selects its program."""

    def __init__(self) -> None:
        self.template: Any = None
        self.kinds: list[tuple[str, Any]] = []  # ("pr" | "rep" | "static", static value)
        self.sharded: list[Any] = []
        self.replicated: list[Any] = []
        self.valid: Any = None
        self.has_valid = False
        self.batch_rows = -1  # axis 0 of the padded batch that ``valid`` counts rows of
        self.padded = False  # whether some replica here got padding rows
        self.key: Any = None


def prepare(
    ext: TPUExtended, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], scan: bool
) -> Prepared:
    """Places the arguments of one call (``scan``: of several steps, stacked on a new axis 1 for
    per-replica values and axis 0 for replicated ones)."""
    out = Prepared()
    flats = [_nest.flatten(s) for s in inputs]
    out.template = _nest.pack_sequence_as(inputs[0], [None] * len(flats[0]))
    n_local = ext._num_local_replicas
    valid_rows: list[list[int]] | None = None
    first_pr = -1
    key = []
    for j, leaf in enumerate(flats[0]):
        column = [f[j] for f in flats]
        if isinstance(leaf, TPUPerReplica) and not scan:  # already on the devices
            out.sharded.append(leaf.global_array)
            out.kinds.append(("pr", None))
            key.append(("pr", leaf.global_array.shape[1:], str(leaf.global_array.dtype)))
        elif isinstance(leaf, DistributedValues) and not isinstance(leaf, DistributedVariable):
            per_step = []  # per step: this process's replicas' components, padded
            for value in column:
                if not isinstance(value, DistributedValues) or len(value.values) != n_local:
                    raise ValueError(
                        f"argument {j} of run: expected a per-replica value with "
                        f"{n_local} components (one per local replica)"
                    )
            top = _agreed_rows(column)
            for value in column:
                comps, rows = _pad_components(value, top)
                per_step.append(comps)
                if rows is not None and any(n < comps[0].shape[0] for n in rows):
                    out.padded = True
                if first_pr < 0 and rows is not None:
                    valid_rows = [[] for _ in range(n_local)]
                    first_pr = j
                    out.batch_rows = comps[0].shape[0]
                if rows is not None and j == first_pr:
                    for r in range(n_local):
                        valid_rows[r].append(rows[r])
            if scan:
                rows_r = [
                    np.stack([step_c[r] for step_c in per_step])[None] for r in range(n_local)
                ]
            else:
                rows_r = [np.asarray(per_step[0][r])[None] for r in range(n_local)]
            out.sharded.append(ext._shard_rows(rows_r))
            out.kinds.append(("pr", None))
            key.append(("pr", rows_r[0].shape[1:], str(rows_r[0].dtype)))
        elif _is_array(leaf):
            arrs = [canonical(host_array(v)) for v in column]
            arr = np.stack(arrs) if scan else arrs[0]
            out.replicated.append(ext._replicate(arr))
            out.kinds.append(("rep", None))
            key.append(("rep", arr.shape, str(arr.dtype)))
        else:
            for v in column[1:]:
                if v is not leaf and v != leaf:
                    raise ValueError(
                        f"run_steps: argument {j} is a Python value that changes "
                        f"between steps ({leaf!r}, {v!r}); pass an array instead"
                    )
            out.kinds.append(("static", leaf))
            try:
                hash(leaf)
                key.append(("static", type(leaf), leaf))
            except TypeError:
                key.append(("static-id", id(leaf)))
    steps = len(inputs)
    if valid_rows is None:
        rows = [np.zeros((1, steps) if scan else (1,), np.int32) for _ in range(n_local)]
    else:
        out.has_valid = True
        rows = [
            np.asarray(v, np.int32)[None] if scan else np.asarray(v[:1], np.int32)
            for v in valid_rows
        ]
    out.valid = ext._shard_rows(rows)
    out.key = (_nest._describe(out.template), tuple(key), out.has_valid)
    return out


def _agreed_rows(column: list[DistributedValues]) -> int | None:
    """The number of rows to pad one per-replica argument's components to, when they are not
    padded already (``PaddedPerReplica``): the most rows of any replica, of every step. With
    several processes, every process must build the same program, so they agree on the most
    rows of any process (an all-gather of one int), not each its own."""
    tops = [
        max(np.shape(c)[0] if np.ndim(c) else 0 for c in value.values)
        for value in column
        if not isinstance(value, PaddedPerReplica)
    ]
    if not tops:
        return None
    top = max(tops)
    jax = _jax.require()
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        top = int(np.max(multihost_utils.process_allgather(np.int32(top))))
    return top


def _pad_components(
    value: DistributedValues, top: int | None = None
) -> tuple[list[np.ndarray], list[int] | None]:
    """The components as arrays of one shape (uneven axis 0 padded with zero rows, to ``top``
    rows when given) and the number of real rows of each (None for scalars)."""
    from .input_lib import pad_rows

    comps = [host_array(c) for c in value.values]
    if isinstance(value, PaddedPerReplica):
        return comps, list(value.valid_rows)
    if comps[0].ndim == 0:
        return comps, None
    rows = [c.shape[0] for c in comps]
    tails = {c.shape[1:] for c in comps}
    if len(tails) != 1:
        raise ValueError(
            f"per-replica components of shapes {[c.shape for c in comps]}: a "
            "compiled step needs one shape on every replica; only axis 0 (the "
            "batch) may differ, and is then padded"
        )
    top = max(rows) if top is None else top
    return [pad_rows(c, top) for c in comps], rows


class Program:
    """One compiled replica step (or block of steps) for one input signature."""

    def __init__(
        self,
        ext: TPUExtended,
        fn: Callable[..., Any],
        prepared: Prepared,
        variables: list[TPUMirroredVariable],
        scan: bool,
    ) -> None:
        jax = _jax.require()
        from jax.sharding import PartitionSpec as P

        self._ext = ext
        self._fn = fn
        # mirrored state is replicated (P()); sync-on-read state has one row per replica
        self._mirrored = [v for v in variables if not v._per_replica]
        self._on_read = [v for v in variables if v._per_replica]
        self._scan = scan
        self._template = prepared.template
        self._kinds = prepared.kinds
        self._has_valid = prepared.has_valid
        self.record: dict[str, Any] = {}
        mapped = jax.shard_map(
            self._body,
            mesh=ext._mesh,
            in_specs=(P(), P(step.AXIS), P(step.AXIS), P(), P(step.AXIS)),
            out_specs=(P(), P(step.AXIS), P(step.AXIS), P()),
            check_vma=True,
        )
        # The variables' old buffers are donated: XLA may write the new values in place.
        self._jitted = jax.jit(mapped, donate_argnums=(0, 1))
        self._compiled: Any = None

    def _replica_step(
        self,
        state: tuple[tuple[Any, ...], tuple[Any, ...]],
        sharded: list[Any],
        replicated: list[Any],
        valid: Any,
    ) -> Any:
        strategy = self._ext._container_strategy()
        trace = step.StepTrace(
            strategy,
            self._mirrored + self._on_read,
            state[0] + state[1],
            valid if self._has_valid else None,
        )
        # Replicated arguments enter as per-replica (varying) copies, as variables do (see
        # step.read): jax.grad with respect to one is then this replica's gradient, not the
        # sum over replicas that the transpose of an invariant value would give.
        replicated = [step.as_per_replica(x) for x in replicated]
        it_s, it_r = iter(sharded), iter(replicated)
        leaves = [
            next(it_s) if kind == "pr" else next(it_r) if kind == "rep" else static
            for kind, static in self._kinds
        ]
        args, kwargs = _nest.pack_sequence_as(self._template, leaves)
        with trace.active(step.TPUReplicaContext(strategy, trace)):
            result = step.call_traced(self._fn, args, kwargs)
        jnp = step.jnp()
        kinds: list[tuple[str, Any]] = []
        arrays = []
        for leaf in _nest.flatten(result):
            if leaf is None or isinstance(leaf, (DistributedVariable, str)):
                kinds.append(("static", leaf))
            else:
                kinds.append(("array", None))
                arrays.append(jnp.asarray(leaf))
        variables, values = trace.final_state()
        groups: tuple[list[Any], list[Any]] = ([], [])
        for var, value in zip(variables, values):
            groups[bool(var._per_replica)].append((var, value))
        self.record.update(
            result=result,
            kinds=kinds,
            checks=trace.check_names,
            valid_rows_read=trace.valid_rows_read,
            mirrored=[v for v, _ in groups[0]],
            on_read=[v for v, _ in groups[1]],
        )
        new_state = (tuple(x for _, x in groups[0]), tuple(x for _, x in groups[1]))
        return new_state, tuple(arrays), trace.checks()

    def _body(
        self,
        mirrored: tuple[Any, ...],
        on_read: tuple[Any, ...],
        sharded: tuple[Any, ...],
        replicated: tuple[Any, ...],
        valid: Any,
    ) -> Any:
        state = (mirrored, tuple(x[0] for x in on_read))
        sharded = [x[0] for x in sharded]
        valid = valid[0]
        if not self._scan:
            new_state, arrays, checks = self._replica_step(state, sharded, list(replicated), valid)
        else:
            from jax import lax

            def one(carry: Any, xs: Any) -> Any:
                new_state, arrays, checks = self._replica_step(
                    carry, list(xs[0]), list(xs[1]), xs[2]
                )
                return new_state, (arrays, checks)

            new_state, (arrays, checks) = lax.scan(
                one, state, (tuple(sharded), tuple(replicated), valid)
            )
            arrays = tuple(a[-1] for a in arrays)
            checks = step.jnp().all(checks, axis=0)
        return (
            new_state[0],
            tuple(x[None] for x in new_state[1]),
            tuple(a[None] for a in arrays),
            checks,
        )

    def _args(self, prepared: Prepared) -> tuple[Any, ...]:
        return (
            tuple(v._device_value for v in self._mirrored),
            tuple(v._device_value for v in self._on_read),
            tuple(prepared.sharded),
            tuple(prepared.replicated),
            prepared.valid,
        )

    def compile(self, prepared: Prepared) -> bool:
        """Traces ``fn`` and compiles the program (ahead of time, one trace). Returns False,
        without compiling, when the trace created variables: the program must then be built
        again with them as inputs."""
        version = self._ext._variables_version
        traced = self._jitted.trace(*self._args(prepared))
        if self._ext._variables_version != version:
            return False
        self._compiled = traced.lower().compile()
        return True

    def trace_only(self, prepared: Prepared) -> None:
        """Traces the program without compiling or running it."""
        _jax.require().eval_shape(self._jitted, *self._args(prepared))

    def __call__(self, prepared: Prepared) -> Any:
        mirrored, on_read, arrays, checks = self._compiled(*self._args(prepared))
        for var, value in zip(self.record["mirrored"] + self.record["on_read"], mirrored + on_read):
            var._set_device_value(value)
        if self.record["checks"]:
            ok = np.asarray(checks)
            bad = [name for name, good in zip(self.record["checks"], ok) if not good]
            if bad:
                raise ValueError(
                    f"{', '.join(bad)}: the variable has aggregation NONE, but replicas passed "
                    "different values; replica 0's value was kept. Pass aggregation=SUM, MEAN "
                    "or ONLY_FIRST_REPLICA to Variable()"
                )
        return self._outputs(arrays, prepared)

    def _outputs(self, arrays: tuple[Any, ...], prepared: Prepared) -> Any:
        ext = self._ext
        it = iter(arrays)
        rows = ext._local_positions
        valid = None
        if prepared.has_valid:  # the last step's counts of real rows
            valid = prepared.valid[:, -1] if self._scan else prepared.valid
        leaves = []
        for kind, static in self.record["kinds"]:
            if kind == "static":
                leaves.append(static)
                continue
            global_array = next(it)
            if ext._num_replicas_in_sync == 1:
                leaves.append(global_array[0])
            else:
                # A result whose axis 0 has the padded batch's size carries the counts of real
                # rows, so that reduce/gather along axis 0 leave the padding out.
                batch = (
                    valid is not None
                    and global_array.ndim >= 2
                    and global_array.shape[1] == prepared.batch_rows
                )
                leaves.append(TPUPerReplica(global_array, rows, valid if batch else None))
        return _nest.pack_sequence_as(self.record["result"], leaves)


def same_shape_runs(elements: list[Any]) -> list[list[Any]]:
    def signature(e: Any) -> Any:
        sig = []
        for leaf in _nest.flatten(e):
            if isinstance(leaf, DistributedValues):
                sig.append(tuple(np.shape(c) for c in leaf.values))
            else:
                sig.append(np.shape(leaf) if _is_array(leaf) else ("static", id(leaf)))
        return (_nest._describe(e), tuple(sig))

    groups: list[list[Any]] = []
    last = None
    for e in elements:
        sig = signature(e)
        if groups and sig == last:
            groups[-1].append(e)
        else:
            groups.append([e])
        last = sig
    return groups
