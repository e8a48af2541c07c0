"""Optimizers that know the strategy: SGD and Adam over distributed variables.

``apply_gradients(grads_and_vars)`` inside ``strategy.run`` all-reduces the gradients across
replicas (MEAN by default) and updates every replica's copies (of the variables and of the
optimizer's slots) with the same reduced gradients, so the copies stay identical. Called in a
cross-replica context, it accepts PerReplica gradients (reduced the same way) or plain ones
(applied to every copy as they are).

For mirrored float32/float64 numpy state the reduction and the update are fused in native code
(``pycollective.fused_update``): replicas in this process are summed and applied in one pass
over memory; across workers (``MultiWorkerBackend.apply_update``) plain SGD on large tensors is
applied inside the all-reduce, and everything else is all-reduced once per bucket of
``bytes_per_pack`` bytes and applied to every local copy in one pass. Other dtypes and
frameworks take the general path: one fused collective per bucket, then each replica's update
in numpy.

With ``MultiWorkerMirroredStrategy(shard_optimizer_state=True)`` (ZeRO stage 1) each worker
keeps only its chunk of every slot (:mod:`.sharded_state`) and a step is one native collective
per dtype: the reduce-scatter of every gradient, the update of this worker's chunk of each
variable and its slots, and the allgather of the new variables, pipelined as one ring
(``fused_update.allreduce_apply(..., sharded_slots=True)``).

Gradients are numpy arrays or torch CPU tensors; the math is the Keras optimizers' (SGD with
momentum/Nesterov, Adam with bias correction folded into the step size).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from pycollective import fused_update

from . import _context, _tensors
from .communication import CommunicationOptions
from .reduce_util import ReduceOp, parse_reduce_op
from .sharded_state import ShardedSlot
from .values import DistributedValues, Mirrored, select_replica
from .variables import (
    DistributedVariable,
    MirroredVariable,
    VariableAggregation,
    VariableSynchronization,
)

#: default size of a gradient bucket (one all-reduce each)
DEFAULT_BYTES_PER_PACK = 4 << 20


class Optimizer:
    """Base class: slots, iterations, gradient aggregation and bucketing.

    Args:
        learning_rate: a float, or a callable ``f(step) -> float`` (step counts from 0).
        name: used in slot names (``"<var name>/<slot>"``).
        gradient_aggregation: ReduceOp.MEAN (default: each replica's gradient is the mean over
            its own batch) or ReduceOp.SUM (each replica's loss is already divided by the
            global batch size, the tf.distribute convention).
        bytes_per_pack: bucket size of the fused gradient all-reduce (default 4 MiB).
    """

    _slot_names: tuple[str, ...] = ()

    def __init__(
        self,
        learning_rate: float | Callable[[int], float] = 0.01,
        name: str = "Optimizer",
        gradient_aggregation: Any = ReduceOp.MEAN,
        bytes_per_pack: int = DEFAULT_BYTES_PER_PACK,
    ) -> None:
        if not callable(learning_rate) and (
            not isinstance(learning_rate, (int, float)) or learning_rate < 0
        ):
            raise ValueError(
                f"learning_rate must be a non-negative number or a callable, got {learning_rate!r}"
            )
        if not isinstance(bytes_per_pack, int) or bytes_per_pack < 0:
            raise ValueError(
                f"bytes_per_pack must be a non-negative integer, got {bytes_per_pack!r}"
            )
        self.learning_rate = learning_rate
        self.name = name
        self.gradient_aggregation = parse_reduce_op(gradient_aggregation)
        self.bytes_per_pack = bytes_per_pack
        self._strategy: Any = None
        # Created in a strategy's scope: that strategy (tf's optimizers capture it too).
        self._scope_strategy = _context.get_strategy() if _context.has_strategy() else None
        self._iterations: DistributedVariable | None = None
        # A slot is a mirrored variable, or this worker's shard of it (ShardedSlot).
        self._slots: dict[int, dict[str, Any]] = {}
        self._slot_order: list[tuple[DistributedVariable, str, Any]] = []
        self._lock = threading.Lock()

    # State --------------------------------------------------------------------------------------

    @property
    def iterations(self) -> DistributedVariable:
        """The number of update steps applied so far (a mirrored int64 variable)."""
        if self._iterations is None:
            self._bind(self._scope_strategy or _context.get_strategy())
        assert self._iterations is not None
        return self._iterations

    def variables(self) -> list[DistributedVariable]:
        """The optimizer's state: iterations, then every slot in creation order."""
        return [self.iterations] + [slot for _, _, slot in self._slot_order]

    def get_slot_names(self) -> list[str]:
        return list(self._slot_names)

    def get_slot(self, var: DistributedVariable, slot_name: str) -> Any:
        """The slot variable; with sharded optimizer state, this worker's ShardedSlot (its
        ``shard``; ``numpy()`` gathers the whole slot, a collective)."""
        try:
            return self._slots[id(var)][slot_name]
        except KeyError:
            raise KeyError(
                f"no slot {slot_name!r} for variable {var.name!r} (slots are created "
                "by the first apply_gradients or by build())"
            ) from None

    def build(self, var_list: Iterable[DistributedVariable]) -> None:
        """Creates the slots of every variable now (apply_gradients does it on first use)."""
        var_list = list(var_list)
        if var_list:
            self._bind(var_list[0].distribute_strategy)
        self._create_slots(var_list)

    def _bind(self, strategy: Any) -> None:
        with self._lock:
            if self._strategy is None:
                self._strategy = strategy
                self._iterations = strategy.extended._create_variable(
                    np.zeros((), np.int64),
                    name=f"{self.name}/iterations",
                    trainable=False,
                    aggregation=VariableAggregation.ONLY_FIRST_REPLICA,
                    synchronization=VariableSynchronization.ON_WRITE,
                    broadcast_initial=False,
                )
            elif strategy is not self._strategy:
                raise ValueError(
                    f"optimizer {self.name!r} was used with {self._strategy!r}; "
                    f"it cannot also update variables of {strategy!r}: create one "
                    "optimizer per strategy"
                )

    def _sharded(self) -> bool:
        """True when this optimizer's strategy shards optimizer state over its workers."""
        return bool(getattr(self._strategy.extended, "_shard_optimizer_state", False))

    def _create_slots(self, var_list: Iterable[DistributedVariable]) -> None:
        with self._lock:
            sharded = self._sharded()
            for var in var_list:
                if id(var) in self._slots:
                    continue
                slots: dict[str, Any] = {}
                for slot_name in self._slot_names:
                    if sharded:
                        shard = ShardedSlot(var, slot_name, self._strategy.extended.backend)
                        slots[slot_name] = shard
                        self._slot_order.append((var, slot_name, shard))
                        continue
                    slot = self._strategy.extended._create_variable(
                        np.zeros(var.shape, var.dtype),
                        name=f"{var.name}/{slot_name}",
                        trainable=False,
                        aggregation=VariableAggregation.NONE,
                        synchronization=VariableSynchronization.ON_WRITE,
                        broadcast_initial=False,
                    )
                    slots[slot_name] = slot
                    self._slot_order.append((var, slot_name, slot))
                self._slots[id(var)] = slots

    def _lr(self, step: int) -> float:
        return float(
            self.learning_rate(step) if callable(self.learning_rate) else self.learning_rate
        )

    # Applying gradients ------------------------------------------------------------------------

    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[Any, DistributedVariable]],
        name: str | None = None,
        skip_gradients_aggregation: bool = False,
    ) -> DistributedVariable:
        """Applies gradients to variables; returns ``iterations``.

        Inside ``strategy.run`` every replica must call it (with its own gradients); unless
        ``skip_gradients_aggregation``, the gradients are reduced over all replicas in sync
        (``gradient_aggregation``) and every copy is updated with the same result, in one fused
        native pass where the state allows it (see the module docstring). ``None`` gradients
        are skipped.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            return self.iterations
        for _, v in pairs:
            if not isinstance(v, DistributedVariable):
                raise TypeError(
                    f"apply_gradients expects (gradient, variable) pairs with "
                    f"variables created by Variable(), got {type(v).__name__}"
                )
        strategy = pairs[0][1].distribute_strategy
        for _, v in pairs[1:]:
            if v.distribute_strategy is not strategy:
                raise ValueError("apply_gradients got variables of different strategies")
        self._bind(strategy)
        variables = [v for _, v in pairs]
        grads = [g for g, _ in pairs]
        compiled = getattr(strategy.extended, "_compiled_apply_gradients", None)
        if compiled is not None:  # TPUStrategy: the update is part of the compiled XLA step
            compiled(self, grads, variables, skip_gradients_aggregation)
            return self.iterations
        ctx = _context.get_replica_context()
        in_replica = ctx is not None and ctx.strategy is strategy
        if in_replica:
            self._create_slots(variables)
            if skip_gradients_aggregation:
                self._apply_on_replica(ctx._local_id, grads, variables)
                return self.iterations
            ctx._exchange(
                f"apply_gradients({len(pairs)} variables)",
                (grads, variables),
                lambda payloads: self._apply_synchronized(strategy, payloads),
            )
            return self.iterations
        # Cross-replica context.
        self._create_slots(variables)
        distributed = [isinstance(g, DistributedValues) for g in grads]
        if all(distributed) and not skip_gradients_aggregation:
            n_local = strategy.extended._num_local_replicas
            self._apply_synchronized(
                strategy,
                [([select_replica(i, g) for g in grads], variables) for i in range(n_local)],
            )
            return self.iterations
        if any(distributed) and not skip_gradients_aggregation:
            pairs_to_reduce = [(g, v) for g, v, d in zip(grads, variables, distributed) if d]
            reduced = iter(
                strategy.extended.batch_reduce_to(
                    self.gradient_aggregation,
                    pairs_to_reduce,
                    options=CommunicationOptions(bytes_per_pack=self.bytes_per_pack),
                )
            )
            grads = [next(reduced) if d else g for g, d in zip(grads, distributed)]
        for i in range(strategy.extended._num_local_replicas):
            local = [
                select_replica(i, g) if isinstance(g, (Mirrored, DistributedValues)) else g
                for g in grads
            ]
            self._apply_on_replica(i, local, variables)
        return self.iterations

    def _apply_synchronized(
        self, strategy: Any, payloads: list[tuple[list[Any], list[DistributedVariable]]]
    ) -> list[None]:
        """Runs once for all local replicas: ``payloads[r]`` is replica r's (gradients,
        variables). Reduces the gradients across all replicas in sync and updates every copy."""
        variables = payloads[0][1]
        for r, (_, vs) in enumerate(payloads[1:], start=1):
            if len(vs) != len(variables) or any(a is not b for a, b in zip(vs, variables)):
                raise ValueError(
                    f"apply_gradients: replica {r} passed other variables than "
                    "replica 0; every replica must update the same variables in "
                    "the same order"
                )
        per_replica = [
            [self._numpy_grad(g, v) for g, v in zip(grads, variables)] for grads, _ in payloads
        ]
        step = int(self.iterations._arrays[0])
        fused = self._fused(step)
        backend = strategy.extended.backend
        if self._sharded():
            self._apply_sharded(backend, fused, per_replica, variables)
            for copy in self.iterations._arrays:
                copy[...] = step + 1
            return [None] * len(payloads)
        # The kernel computes from copy 0 and writes every copy: only for mirrored state,
        # whose copies are identical (a sync-on-read variable's copies differ on purpose).
        states = (
            [self._replicated(v, [ts[i] for ts in per_replica]) for i, v in enumerate(variables)]
            if fused is not None
            else []
        )
        if (
            fused is not None
            and all(isinstance(v, MirroredVariable) for v in variables)
            and fused_update.supported(states)
        ):
            rule, hyper = fused
            hyper = self._aggregating(hyper, backend)
            backend.apply_update(
                rule,
                hyper,
                per_replica,
                lambda i, grads: fused_update.ReplicatedTensor(
                    grads, states[i].copies, states[i].slots
                ),
                self.bytes_per_pack,
            )
            for copy in self.iterations._arrays:
                copy[...] = step + 1
        else:
            if backend.num_replicas_in_sync > 1:
                per_replica = backend.batch_allreduce(
                    per_replica,
                    self.gradient_aggregation,
                    bytes_per_pack=self.bytes_per_pack,
                    num_packs=strategy.extended._cross_device_ops.num_packs,
                )
            for index, grads in enumerate(per_replica):
                self._apply_on_replica(index, grads, variables)
        return [None] * len(payloads)

    def _apply_sharded(
        self,
        backend: Any,
        fused: tuple[str, fused_update.Hyper] | None,
        per_replica: list[list[np.ndarray]],
        variables: list[DistributedVariable],
    ) -> None:
        """ZeRO-1: every tensor's gradient is reduce-scattered, this worker's chunk of the
        variable and of its slot shards updated by the native kernel, and the variable
        allgathered, as one pipelined ring (``backend.apply_sharded_update``)."""
        why = None
        if fused is None:
            why = (
                f"{type(self).__name__} has no native update rule (only SGD and Adam, without "
                "an overridden _update_step, do)"
            )
        else:
            for v in variables:
                if not isinstance(v, MirroredVariable) or v.dtype not in (
                    np.float32,
                    np.float64,
                ):
                    why = f"variable {v.name!r} is a {type(v).__name__} of {v.dtype}"
                    break
        if why is not None:
            raise TypeError(
                f"worker {backend.worker_index}: sharded optimizer state updates mirrored "
                f"float32/float64 variables with the native SGD and Adam rules, but {why}; "
                "create the strategy without shard_optimizer_state=True for this model"
            )
        assert fused is not None
        rule, hyper = fused
        backend.apply_sharded_update(
            rule,
            self._aggregating(hyper, backend),
            per_replica,
            lambda i, grads: self._replicated(variables[i], grads),
        )

    def _aggregating(self, hyper: fused_update.Hyper, backend: Any) -> fused_update.Hyper:
        """``hyper`` with the gradient scale of this optimizer's aggregation: the native
        kernels see the sum over all replicas in sync (MEAN: times 1/N)."""
        scale = (
            1.0 / backend.num_replicas_in_sync
            if self.gradient_aggregation == ReduceOp.MEAN
            else 1.0
        )
        return dataclasses.replace(hyper, grad_scale=scale)

    def _replicated(
        self, var: DistributedVariable, grads: list[np.ndarray]
    ) -> fused_update.ReplicatedTensor:
        slots = self._slots[id(var)]
        return fused_update.ReplicatedTensor(
            grads,
            var._arrays,
            [
                [slot.shard] if isinstance(slot, ShardedSlot) else slot._arrays
                for slot in (slots[name] for name in self._slot_names)
            ],
        )

    @staticmethod
    def _numpy_grad(g: Any, var: DistributedVariable) -> np.ndarray:
        if (
            type(g) is np.ndarray
            and g.dtype == var.dtype
            and g.shape == var.shape
            and g.flags.c_contiguous
        ):
            return g  # the common case, without building the error context below
        grad = _tensors.to_numpy(g, f"gradient of {var.name!r}")
        if grad.shape != var.shape:
            raise ValueError(
                f"gradient of {var.name!r} has shape {grad.shape}, the "
                f"variable has shape {var.shape}"
            )
        return _tensors.contiguous(grad.astype(var.dtype, copy=False))

    def _apply_on_replica(
        self, index: int, grads: list[Any], variables: list[DistributedVariable]
    ) -> None:
        """Replica ``index`` applies its (already reduced) gradients to its own copies."""
        if self._sharded():
            raise RuntimeError(
                f"{self.name}: with sharded optimizer state a worker holds only its shard of "
                "each slot, so it cannot apply gradients it did not reduce with the other "
                "workers (skip_gradients_aggregation=True, or plain gradients in a "
                "cross-replica context); pass PerReplica gradients or call apply_gradients "
                "inside strategy.run, or create the strategy without shard_optimizer_state"
            )
        iterations = self.iterations
        step = int(iterations._arrays[index])
        lr = self._lr(step)
        for g, var in zip(grads, variables):
            grad = self._numpy_grad(g, var)
            slots = {name: slot._arrays[index] for name, slot in self._slots[id(var)].items()}
            self._update_step(var._arrays[index], grad, slots, lr, step)
        iterations._arrays[index][...] = step + 1

    def _fused(self, step: int) -> tuple[str, fused_update.Hyper] | None:
        """The native rule and numbers for this step (pycollective.fused_update), or None when
        the optimizer has none (its ``_update_step`` then runs per replica). Subclasses return
        one only while ``_update_step`` is still theirs: a further subclass that overrides it
        (clipping, weight decay) must have its own arithmetic run."""
        return None

    def _overrides_update_step(self, owner: type) -> bool:
        return type(self)._update_step is not owner._update_step

    def _update_step(
        self, var: np.ndarray, grad: np.ndarray, slots: dict[str, np.ndarray], lr: float, step: int
    ) -> None:
        """Updates ``var`` (one replica's copy) in place."""
        raise NotImplementedError

    def _functional_update(
        self, var: Any, grad: Any, slots: dict[str, Any], lr: Any, step: Any, xp: Any
    ) -> tuple[Any, dict[str, Any]]:
        """The same rule as ``_update_step`` without mutation, for compiled steps
        (TPUStrategy): returns ``(new_var, new_slots)``. ``xp`` is the array module (jax.numpy);
        ``lr`` and ``step`` may be traced scalars."""
        raise NotImplementedError(
            f"{type(self).__name__} has no functional update rule, so it cannot update "
            "variables inside a compiled TPUStrategy step; use SGD or Adam, or define "
            "_functional_update"
        )

    def _check_functional(self, owner: type) -> None:
        if self._overrides_update_step(owner):
            raise NotImplementedError(
                f"{type(self).__name__} overrides _update_step, which a compiled TPUStrategy "
                "step cannot run (it updates numpy arrays in place); override "
                "_functional_update too, with the same arithmetic on jax arrays"
            )

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "learning_rate": self.learning_rate,
            "gradient_aggregation": self.gradient_aggregation.name,
            "bytes_per_pack": self.bytes_per_pack,
        }


class SGD(Optimizer):
    """Gradient descent (with momentum, optionally Nesterov), as Keras defines it.

    ``momentum == 0``: ``w -= lr * g``. Otherwise ``m = momentum * m - lr * g`` and
    ``w += m`` (Nesterov: ``w += momentum * m - lr * g``).
    """

    def __init__(
        self,
        learning_rate: float | Callable[[int], float] = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        name: str = "SGD",
        **kwargs: Any,
    ) -> None:
        if not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
            raise ValueError(f"momentum must be a number in [0, 1], got {momentum!r}")
        super().__init__(learning_rate, name, **kwargs)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self._slot_names = ("momentum",) if self.momentum > 0 else ()

    def _update_step(
        self, var: np.ndarray, grad: np.ndarray, slots: dict[str, np.ndarray], lr: float, step: int
    ) -> None:
        lr_t = var.dtype.type(lr)
        if self.momentum == 0:
            var -= lr_t * grad
            return
        m = slots["momentum"]
        mom = var.dtype.type(self.momentum)
        m *= mom
        m -= lr_t * grad
        if self.nesterov:
            var += mom * m - lr_t * grad
        else:
            var += m

    def _functional_update(
        self, var: Any, grad: Any, slots: dict[str, Any], lr: Any, step: Any, xp: Any
    ) -> tuple[Any, dict[str, Any]]:
        self._check_functional(SGD)
        if self.momentum == 0:
            return var - lr * grad, {}
        m = self.momentum * slots["momentum"] - lr * grad
        if self.nesterov:
            return var + (self.momentum * m - lr * grad), {"momentum": m}
        return var + m, {"momentum": m}

    def _fused(self, step: int) -> tuple[str, fused_update.Hyper] | None:
        if self._overrides_update_step(SGD):
            return None
        rule = "sgd" if self.momentum == 0 else ("nesterov" if self.nesterov else "momentum")
        return rule, fused_update.Hyper(lr=self._lr(step), momentum=self.momentum)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam, as Keras defines it::

    alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)      (t = step + 1)
    m += (g - m) * (1 - beta_1)
    v += (g * g - v) * (1 - beta_2)
    w -= alpha * m / (sqrt(v) + epsilon)
    """

    _slot_names = ("m", "v")

    def __init__(
        self,
        learning_rate: float | Callable[[int], float] = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        name: str = "Adam",
        **kwargs: Any,
    ) -> None:
        for label, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{label} must be a number in [0, 1), got {value!r}")
        if not isinstance(epsilon, (int, float)) or epsilon < 0:
            raise ValueError(f"epsilon must be a non-negative number, got {epsilon!r}")
        super().__init__(learning_rate, name, **kwargs)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)

    def _step_size(self, lr: float, step: int) -> float:
        t = step + 1
        return lr * np.sqrt(1 - self.beta_2**t) / (1 - self.beta_1**t)

    def _fused(self, step: int) -> tuple[str, fused_update.Hyper] | None:
        if self._overrides_update_step(Adam):
            return None
        return "adam", fused_update.Hyper(
            lr=self._step_size(self._lr(step), step),
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            epsilon=self.epsilon,
        )

    def _functional_update(
        self, var: Any, grad: Any, slots: dict[str, Any], lr: Any, step: Any, xp: Any
    ) -> tuple[Any, dict[str, Any]]:
        self._check_functional(Adam)
        # t and the step size in float32 whatever the variable's dtype: in float16 or bfloat16
        # beta ** t loses most of its digits (and t itself past 2048 or 256).
        t = (step + 1).astype(xp.float32)
        alpha = (
            lr * xp.sqrt(1 - xp.float32(self.beta_2) ** t) / (1 - xp.float32(self.beta_1) ** t)
        ).astype(var.dtype)
        m = slots["m"] + (grad - slots["m"]) * (1 - self.beta_1)
        v = slots["v"] + (grad * grad - slots["v"]) * (1 - self.beta_2)
        return var - alpha * m / (xp.sqrt(v) + self.epsilon), {"m": m, "v": v}

    def _update_step(
        self, var: np.ndarray, grad: np.ndarray, slots: dict[str, np.ndarray], lr: float, step: int
    ) -> None:
        alpha = var.dtype.type(self._step_size(lr, step))
        m, v = slots["m"], slots["v"]
        m += (grad - m) * var.dtype.type(1 - self.beta_1)
        v += (grad * grad - v) * var.dtype.type(1 - self.beta_2)
        var -= alpha * m / (np.sqrt(v) + var.dtype.type(self.epsilon))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
        }
