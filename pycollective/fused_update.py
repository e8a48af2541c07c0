"""Optimizer updates fused with the reduction of the replicas' gradients (native).

For replicas that share a process, "all-reduce the gradients, then update every replica's copy
of the variable and of its slots" is one pass over memory (csrc/optim/replicated_update.h):
every gradient is read once, the state is read from copy 0 (the copies are identical), and the
new state is written into every copy (:func:`apply`). Across the processes of a group,
:func:`allreduce_apply` fuses the update into the all-reduce of the gradients instead. The
strategies' optimizers use both; they are public for anyone who keeps replicated state in numpy
arrays.

Only float32 and float64 C-contiguous, aligned numpy arrays qualify: :func:`supported` says
whether a set of arrays does, so callers keep their own arithmetic for everything else. The
state arrays (copies and slots) must not overlap one another or the gradients.

Sharded optimizer state (ZeRO stage 1): ``allreduce_apply(..., sharded_slots=True)`` takes, for
every slot, one array holding only this rank's chunk of it (:func:`shard_bounds`); each rank
keeps 1/N of the slots and only the variable is allgathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._calls import chunk_bounds
from pycollective._ext import _C

_SLOTS = {"sgd": (), "momentum": ("momentum",), "nesterov": ("momentum",), "adam": ("m", "v")}
#: rule name -> (native code, slot names in native order); the codes come from the extension
RULES: dict[str, tuple[int, tuple[str, ...]]] = {
    name: (code, _SLOTS[name]) for name, code in _C.enum_codes()["update_rule"].items()
}
_DTYPE_CODES = {np.dtype(name): _C.enum_codes()["dtype"][name] for name in ("float32", "float64")}


@dataclass(frozen=True)
class Hyper:
    """The rule's numbers. ``lr`` is Adam's bias-corrected step size for "adam"; the summed
    gradient is multiplied by ``grad_scale`` (``1/N`` for a mean over N replicas)."""

    lr: float
    momentum: float = 0.0
    beta_1: float = 0.0
    beta_2: float = 0.0
    epsilon: float = 0.0
    grad_scale: float = 1.0


@dataclass
class ReplicatedTensor:
    """One variable: its gradients (summed), its copies (copy 0 is read), and for every slot
    of the rule the slot's copies (one per variable copy)."""

    grads: Sequence[np.ndarray]
    copies: Sequence[np.ndarray]
    slots: Sequence[Sequence[np.ndarray]] = ()


def shard_bounds(count: int, size: int, rank: int) -> tuple[int, int]:
    """The element range ``[start, stop)`` of a ``count``-element tensor that rank ``rank`` of
    ``size`` owns in :func:`allreduce_apply` with ``sharded_slots=True`` (its chunk of the
    reduce-scatter: the first ``count % size`` ranks own one element more; a rank may own none).
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"shard_bounds: rank {rank} is not in a group of {size}")
    return chunk_bounds(count, size, rank)


def _arrays_qualify(
    arrays: Sequence[object], dtype: np.dtype, shape: tuple[int, ...], writable: bool
) -> bool:
    for a in arrays:
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
            return False
        flags = a.flags  # a new object per access: read it once
        # carray: C-contiguous, aligned and writeable.
        if not (flags.carray if writable else flags.c_contiguous and flags.aligned):
            return False
    return True


def supported(tensors: Sequence[ReplicatedTensor]) -> bool:
    """True when every array is a C-contiguous float32/float64 numpy array of its variable's
    shape and dtype (state arrays writable): the native path applies. False means: use your
    own arithmetic."""
    for t in tensors:
        if not t.copies or not t.grads:
            return False
        ref = t.copies[0]
        if not isinstance(ref, np.ndarray) or ref.dtype not in _DTYPE_CODES:
            return False
        dtype, shape = ref.dtype, ref.shape
        if not _arrays_qualify(t.copies, dtype, shape, True):
            return False
        for slot in t.slots:
            if not _arrays_qualify(slot, dtype, shape, True):
                return False
        if not _arrays_qualify(t.grads, dtype, shape, False):
            return False
    return True


def apply(rule: str, hyper: Hyper, tensors: Sequence[ReplicatedTensor], check: bool = True) -> None:
    """Applies ``rule`` to every tensor (see csrc/optim/replicated_update.h for the math).

    Every tensor must pass :func:`supported`, hold one dtype across tensors of a call, and give
    the rule's slots (``RULES[rule][1]``, in that order) with one array per copy.
    ``check=False`` skips the :func:`supported` test, for a caller that just made it on these
    arrays (as scipy's ``check_finite=False``); the other checks always run.
    """
    code, dtype_code, items = _native_items(rule, tensors, check)
    if items:
        _C.apply_replicated_update(
            rule=code, dtype=dtype_code, hyper=_hyper_tuple(hyper), tensors=items
        )


def allreduce_apply(
    rule: str,
    hyper: Hyper,
    tensors: Sequence[ReplicatedTensor],
    group: Any = None,
    timeout: float | None = None,
    check: bool = True,
    sharded_slots: bool = False,
) -> None:
    """Optimizer steps across the processes of a group (``pycollective.init``): for every
    tensor, each rank passes its gradient (``grads``: one array, e.g. the sum of its local
    replicas) and its copies of the state; the rule is applied to ``grad_scale * (sum over the
    ranks)`` and every copy on every rank ends with the same new state.

    Each is the all-reduce of the gradient with the update fused into it (ZeRO's
    reduce-scatter, update, allgather as one pipelined ring): each rank updates only the chunk
    of the state whose sum it owns, as the sum arrives, and the ring then carries the new
    state (variable and slots) instead of the summed gradient
    (csrc/optim/allreduce_update.h). All tensors of a call run as ONE collective (one
    pipelined ring, each tensor chunked on its own): every rank of the group must make the same
    call, with the same tensors in the same order, in the same order as its other collectives.
    ``group``: a ``pycollective.new_group`` group (default: all ranks); ``check`` as for
    :func:`apply`.

    ``sharded_slots=True`` (ZeRO stage 1): every slot of a tensor is ONE array (whatever the
    number of copies) of this rank's chunk of that slot, ``shard_bounds(count, group size,
    group rank)``, 1-D, of the variable's dtype; the chunk is updated where it is reduced and
    only the variable is allgathered. Every rank must pass the same flag (the frame header
    carries it: a rank that does not gets a ProtocolError).
    """
    from pycollective import process_group
    from pycollective.tensors import shape_hash

    pg = process_group._group(group)
    if sharded_slots:
        code, dtype_code, items = _sharded_items(rule, tensors, pg.rank, pg.size, check)
    else:
        code, dtype_code, items = _native_items(rule, tensors, check)
    for i, t in enumerate(tensors):
        if len(t.grads) != 1:
            raise ValueError(
                f"allreduce_apply: tensor {i} has {len(t.grads)} gradients; pass "
                "this rank's one gradient (sum the local replicas' first)"
            )
    pg._run_native(
        _C.allreduce_update,
        comm=pg._world.comm,
        rule=code,
        dtype=dtype_code,
        hyper=_hyper_tuple(hyper),
        tensors=items,
        shape_hashes=[shape_hash(t.copies[0].shape) for t in tensors],
        timeout=pg._timeout(timeout),
        members=pg.members,
        group_id=pg.group_id,
        sharded_slots=sharded_slots,
    )


def _hyper_tuple(hyper: Hyper) -> tuple[float, ...]:
    return (hyper.lr, hyper.momentum, hyper.beta_1, hyper.beta_2, hyper.epsilon, hyper.grad_scale)


def _sharded_items(
    rule: str, tensors: Sequence[ReplicatedTensor], rank: int, size: int, check: bool
) -> tuple[int, int, list[tuple[Any, ...]]]:
    """``_native_items`` for sharded slots: the variable's copies and gradient as usual, every
    slot one writable 1-D array of this rank's chunk (checked always: the native side cannot
    see an array's size, and a short shard would be written past its end)."""
    if rule not in RULES:
        raise ValueError(f"unknown update rule {rule!r}; known: {', '.join(RULES)}")
    slot_names = RULES[rule][1]
    for i, t in enumerate(tensors):
        if len(t.slots) != len(slot_names):
            raise ValueError(
                f"tensor {i}: rule {rule!r} keeps slots {slot_names}, got {len(t.slots)} slot(s)"
            )
    code, dtype_code, items = _native_items(
        rule, [ReplicatedTensor(t.grads, t.copies, [[]] * len(t.slots)) for t in tensors], check
    )
    for i, t in enumerate(tensors):
        ref = t.copies[0]
        start, stop = shard_bounds(ref.size, size, rank)
        for name, shard in zip(slot_names, t.slots):
            if len(shard) != 1 or not _arrays_qualify(shard, ref.dtype, (stop - start,), True):
                raise ValueError(
                    f"tensor {i}: with sharded_slots, slot {name!r} must be one writable "
                    f"C-contiguous {ref.dtype} array of shape ({stop - start},) (rank {rank} "
                    f"of {size} owns elements [{start}, {stop}) of {ref.size})"
                )
        items[i] = (*items[i][:3], [list(shard) for shard in t.slots])
    return code, dtype_code, items


def _native_items(
    rule: str, tensors: Sequence[ReplicatedTensor], check: bool
) -> tuple[int, int, list[tuple[Any, ...]]]:
    """The rule's code, the dtype's code and the tensors as the native functions take them."""
    if rule not in RULES:
        raise ValueError(f"unknown update rule {rule!r}; known: {', '.join(RULES)}")
    code, slot_names = RULES[rule]
    if not tensors:
        return code, 0, []
    if check and not supported(tensors):
        raise TypeError(
            "fused_update needs C-contiguous float32/float64 numpy arrays of "
            "the variable's shape (writable state); check supported() first"
        )
    dtype = tensors[0].copies[0].dtype
    items = []
    for i, t in enumerate(tensors):
        if t.copies[0].dtype != dtype:
            raise TypeError(
                f"tensor {i} is {t.copies[0].dtype}, tensor 0 is {dtype}: one dtype per call"
            )
        if len(t.slots) != len(slot_names):
            raise ValueError(
                f"tensor {i}: rule {rule!r} keeps slots {slot_names}, got {len(t.slots)} slot(s)"
            )
        items.append((t.copies[0].size, list(t.grads), list(t.copies), [list(s) for s in t.slots]))
    return code, _DTYPE_CODES[dtype], items
