"""Tracing a replica function into one XLA SPMD program.

``strategy.run(fn)`` traces ``fn`` once per input signature inside ``jax.shard_map`` over the
strategy's one-axis mesh (axis ``"replica"``) and compiles it with ``jax.jit``. While ``fn`` is
traced, a :class:`StepTrace` is current on the calling thread: variables read as traced values,
their updates are recorded, and the replica context's collectives are XLA collectives
(``psum``/``pmean``/``all_gather``) on the mesh axis.

The gradient trap. A replicated input is *invariant* over the mesh axis in shard_map's
varying-axes typing, and the transpose of using an invariant value in per-replica (varying)
arithmetic is a ``psum``: ``jax.grad`` with respect to an invariant parameter returns the SUM of
every replica's gradient. An all-reduce on top would then count it N times. So a replica
function reads each variable, and gets each replicated array argument of ``run``, as a
*varying* copy (``pcast(..., to="varying")``), exactly as each MirroredStrategy replica reads
its own copy: ``jax.grad`` gives this replica's gradient, and
``apply_gradients``/``all_reduce`` reduce it once. The step's state stays invariant: updates
are computed from the invariant value and all-reduced (invariant) values.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import _context, _nest
from ..reduce_util import ReduceOp, parse_reduce_op
from ..strategy import ReplicaContext
from ..variables import DistributedVariable, VariableAggregation
from . import _jax

if TYPE_CHECKING:
    from .strategy import TPUStrategy

AXIS = "replica"

_local = threading.local()


class StepTraceError(TypeError):
    """``fn`` could not be traced into a compiled step (it needs a concrete value)."""


def jnp() -> Any:
    _jax.require()
    import jax.numpy

    return jax.numpy


def _lax() -> Any:
    _jax.require()
    from jax import lax

    return lax


def current() -> StepTrace | None:
    return getattr(_local, "trace", None)


def tracing_for(strategy: Any) -> bool:
    trace = current()
    return trace is not None and trace.strategy is strategy


def read(var: DistributedVariable) -> Any:
    """``var``'s traced value for the replica function (varying over the mesh axis), or None
    when no step of its strategy is being traced."""
    trace = current()
    if trace is None or trace.strategy is not var.distribute_strategy:
        return None
    value = trace.get(var)
    return value if var._per_replica else as_per_replica(value)


def as_per_replica(x: Any) -> Any:
    """``x`` (invariant over the mesh axis) as a per-replica (varying) value: how a replica
    function sees variables and replicated arguments of ``run``."""
    return _lax().pcast(x, AXIS, to="varying")


def write(var: DistributedVariable, kind: str, value: Any) -> None:
    """Records a replica-context ``assign``/``assign_add``/``assign_sub`` in the traced step."""
    current().update_variable(var, kind, value)


def is_varying(x: Any) -> bool:
    """Whether ``x`` may differ between replicas (shard_map's varying-axes type)."""
    import jax

    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # jax < 0.9
    if vma is None:
        vma = aval.manual_axis_type.varying
    return AXIS in vma


class StepTrace:
    """The state of one replica step while it is traced: the variables' current values."""

    def __init__(
        self,
        strategy: TPUStrategy,
        variables: list[DistributedVariable],
        values: tuple[Any, ...],
        valid_rows: Any,
    ) -> None:
        self.strategy = strategy
        self._vars: dict[int, DistributedVariable] = {id(v): v for v in variables}
        self._values: dict[int, Any] = {id(v): x for v, x in zip(variables, values)}
        self.valid_rows = valid_rows
        self.valid_rows_read = False  # whether fn asked for experimental_valid_rows
        self.check_names: list[str] = []
        self._checks: list[Any] = []

    # Variables ----------------------------------------------------------------------------------

    def get(self, var: DistributedVariable) -> Any:
        """The variable's current invariant value in this step."""
        key = id(var)
        if key not in self._values:
            if var.distribute_strategy is not self.strategy:
                raise TypeError(
                    f"variable {var.name!r} belongs to {var.distribute_strategy!r}, "
                    f"not to {self.strategy!r}, whose step is being compiled"
                )
            # Created while this step was traced (an optimizer's slots on first use): it
            # enters the step as a constant and leaves it as an output.
            self._vars[key] = var
            value = jnp().asarray(var._initial_value, dtype=self._jax_dtype(var))
            if var._per_replica:  # every replica's own copy
                value = _lax().pcast(value, AXIS, to="varying")
            self._values[key] = value
        return self._values[key]

    def set(self, var: DistributedVariable, value: Any) -> None:
        """Sets the variable's new value (must be invariant: the same on every replica)."""
        self.get(var)
        value = jnp().asarray(value)
        if value.shape != var.shape:
            raise ValueError(
                f"cannot update variable {var.name!r} of shape {var.shape} with a "
                f"value of shape {value.shape}"
            )
        value = value.astype(self._jax_dtype(var))
        if not var._per_replica and is_varying(value):
            raise ValueError(
                f"the new value of mirrored variable {var.name!r} may differ "
                "between replicas (it depends on per-replica data); all-reduce it "
                "first, or assign through the variable's aggregation"
            )
        if var._per_replica and not is_varying(value):
            value = _lax().pcast(value, AXIS, to="varying")  # the carry keeps one type
        self._values[id(var)] = value

    @staticmethod
    def _jax_dtype(var: DistributedVariable) -> Any:
        import jax

        return jax.dtypes.canonicalize_dtype(var.dtype)

    def update_variable(self, var: DistributedVariable, kind: str, value: Any) -> None:
        """A replica-context update, combined across replicas by the variable's aggregation."""
        lax = _lax()
        v = jnp().asarray(value, dtype=self._jax_dtype(var))
        agg = var.aggregation
        varying = is_varying(v)
        if var._per_replica:  # sync on read: each replica updates its own copy
            pass
        elif agg in (VariableAggregation.SUM, VariableAggregation.MEAN):
            # An invariant value counts as the same value passed by every replica (tf's rule:
            # SUM gives N times it), which is what psum of an invariant value computes.
            v = (lax.psum if agg == VariableAggregation.SUM else lax.pmean)(v, AXIS)
        elif varying:  # ONLY_FIRST_REPLICA, or NONE: take replica 0's value
            if agg == VariableAggregation.NONE:
                same = jnp().all(lax.pmax(v, AXIS) == lax.pmin(v, AXIS))
                self._checks.append(same)
                self.check_names.append(f"{kind} of variable {var.name!r}")
            first = lax.axis_index(AXIS) == 0
            v = lax.psum(jnp().where(first, v, jnp().zeros_like(v)), AXIS)
        current = self.get(var)
        if kind == "assign_add":
            v = current + v
        elif kind == "assign_sub":
            v = current - v
        self.set(var, v)

    def final_state(self) -> tuple[list[DistributedVariable], list[Any]]:
        keys = list(self._values)
        return [self._vars[k] for k in keys], [self._values[k] for k in keys]

    def checks(self) -> Any:
        if not self._checks:
            return jnp().zeros((0,), bool)
        return jnp().stack(self._checks)

    @contextlib.contextmanager
    def active(self, context: TPUReplicaContext) -> Iterator[None]:
        previous = current()
        frame = _context.Frame(self.strategy, context)
        _context.push(frame)
        _local.trace = self
        try:
            yield
        finally:
            _local.trace = previous
            _context.unwind(frame)


class _InStep:
    """Marks a TPUReplicaContext as inside ``run`` (the checks for cross-replica-only calls
    look for collective slots)."""


class TPUReplicaContext(ReplicaContext):
    """The replica context inside a TPUStrategy replica function: one traced SPMD program
    stands for every replica, and collectives are XLA collectives over the mesh axis."""

    def __init__(self, strategy: TPUStrategy, trace: StepTrace) -> None:
        self._strategy = strategy
        self._trace = trace
        self._replica_id = None
        self._local_id = None
        self._collective_slots = _InStep()  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TPUReplicaContext({self._strategy.num_replicas_in_sync} replicas, traced)"

    @property
    def replica_id_in_sync_group(self) -> Any:
        """This replica's id, a traced int32 scalar (``lax.axis_index``): use it in
        computations, not in Python control flow."""
        return _lax().axis_index(AXIS)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self._strategy.extended.worker_devices)

    @property
    def experimental_valid_rows(self) -> Any:
        """How many rows of this replica's batch are real data (a traced int32 scalar); the
        rest, up to the batch's static size, are zero padding (see TPUStrategy: uneven
        batches). Counted on axis 0 of the first per-replica argument of ``run``."""
        if self._trace.valid_rows is None:
            raise ValueError(
                "experimental_valid_rows counts the rows of the first PerReplica "
                "argument of strategy.run, and this run got none"
            )
        self._trace.valid_rows_read = True
        return self._trace.valid_rows

    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        """All-reduces ``value`` (a nest of arrays) across replicas with ``lax.psum`` /
        ``lax.pmean``; every replica gets the result."""
        op = parse_reduce_op(reduce_op)
        lax = _lax()
        fn = lax.psum if op == ReduceOp.SUM else lax.pmean
        return _nest.map_structure(lambda x: fn(jnp().asarray(x), AXIS), value)

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """All-gathers ``value`` (a nest) along ``axis`` with ``lax.all_gather``: every replica
        gets the concatenation in replica order. Shapes must be the same on every replica (a
        compiled program has static shapes)."""
        lax = _lax()
        return _nest.map_structure(
            lambda x: lax.all_gather(jnp().asarray(x), AXIS, axis=axis, tiled=True), value
        )

    def merge_call(self, merge_fn: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(
            "merge_call is not available in a TPUStrategy replica function: the replicas run as "
            "one compiled SPMD program, so there is no point where they stop and run Python "
            "once. Use get_replica_context().all_reduce/all_gather, or an optimizer's "
            "apply_gradients, which update variables inside the compiled step"
        )

    def _exchange(self, what: str, value: Any, fn: Any) -> Any:
        raise NotImplementedError(
            f"{what} needs the replicas to meet in Python, which a "
            "compiled TPUStrategy step cannot do"
        )


def apply_gradients(
    strategy: TPUStrategy,
    opt: Any,
    grads: list[Any],
    variables: list[DistributedVariable],
    skip_aggregation: bool,
) -> None:
    """An optimizer's update inside the traced step: gradients all-reduced with XLA
    collectives (unless ``skip_aggregation``), then the optimizer's functional rule."""
    trace = current()
    lax = _lax()
    np_ = jnp()
    opt._create_slots(variables)
    step = trace.get(opt.iterations)
    lr = opt.learning_rate(step) if callable(opt.learning_rate) else opt.learning_rate
    for g, var in zip(grads, variables):
        g = np_.asarray(g, dtype=StepTrace._jax_dtype(var))
        if g.shape != var.shape:
            raise ValueError(
                f"gradient of {var.name!r} has shape {g.shape}, the variable has shape {var.shape}"
            )
        if skip_aggregation:
            if is_varying(g):
                raise ValueError(
                    f"apply_gradients(skip_gradients_aggregation=True) got a gradient of "
                    f"{var.name!r} that differs between replicas; all-reduce it first "
                    "(get_replica_context().all_reduce) or let apply_gradients aggregate it"
                )
        else:
            reduce = lax.psum if opt.gradient_aggregation == ReduceOp.SUM else lax.pmean
            g = reduce(g, AXIS)
        slots = {name: trace.get(slot) for name, slot in opt._slots[id(var)].items()}
        new_var, new_slots = opt._functional_update(trace.get(var), g, slots, lr, step, np_)
        trace.set(var, new_var)
        for name, value in new_slots.items():
            trace.set(opt._slots[id(var)][name], value)
    trace.set(opt.iterations, step + 1)


def call_traced(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Calls the replica function under tracing; a Python-level use of a traced value becomes
    an error that says what a compiled step allows."""
    import jax

    try:
        return fn(*args, **kwargs)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerBoolConversionError,
        jax.errors.TracerIntegerConversionError,
    ) as exc:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise StepTraceError(
            f"TPUStrategy.run compiles {name}() with XLA, so it must be traceable by JAX: its "
            "arguments and variables are abstract values while it is traced (once per input "
            "signature), so Python control flow on them, numpy calls on them (np.asarray, "
            "float(), .item()) and other host work cannot see their values. Use jax.numpy, "
            "lax.cond/lax.select for data-dependent choices, and return values to inspect "
            f"them after the step. JAX said: {type(exc).__name__}: {exc}"
        ) from exc
