"""What torch passes a backend, in pycollective's terms: reduction ops, contiguous buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pycollective.tensors import bf16_dtype

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def reduce_op(op: dist.ReduceOp, where: str) -> tuple[str, float | torch.Tensor | None]:
    """``(pycollective op, premul factor or None)``. PREMUL_SUM is a sum of inputs scaled by
    the op's factor (a number or a one-element tensor)."""
    if op == dist.ReduceOp.PREMUL_SUM:
        return "sum", op.factor
    for torch_op, name in _OPS.items():
        if op == torch_op:
            return name, None
    raise ValueError(
        f"{where}: ReduceOp {op.op if hasattr(op, 'op') else op} is not supported "
        "by the pycollective backend; use SUM, PRODUCT, MIN, MAX, AVG or "
        "PREMUL_SUM"
    )


def scaled(t: torch.Tensor, factor: float | torch.Tensor | None) -> torch.Tensor:
    """The input of a PREMUL_SUM: a scaled copy (the caller's input is left as it was)."""
    if factor is None:
        return t
    return t * (factor.to(t.device, t.dtype) if isinstance(factor, torch.Tensor) else factor)


# The dtypes pycollective reduces that a numpy array can carry (bfloat16 through ml_dtypes).
_NUMPY_DTYPES = (
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
)


def host_array(t: torch.Tensor) -> Any:
    """A contiguous CPU tensor as a numpy array over the same memory (which keeps the tensor
    alive), else the tensor itself. A process group remembers calls on small numpy arrays and
    runs them again natively (pycollective/_call_memo.py), while a torch tensor is adapted and
    checked anew on every call: ``dist.all_reduce`` of 4 KiB with one rank took 8.8 us this way
    against 13.1 us (docs/benchmarks.md, "Small calls: numpy views of the tensors")."""
    if t.device.type != "cpu" or not t.is_contiguous():
        return t
    if t.requires_grad:
        t = t.detach()
    try:
        if t.dtype in _NUMPY_DTYPES:
            return t.numpy()
        if t.dtype == torch.bfloat16 and (bf16 := bf16_dtype()) is not None:
            return t.view(torch.int16).numpy().view(bf16)
    except RuntimeError:  # a view numpy cannot share (a negated or conjugated one)
        pass
    return t  # the full path takes it, and names what it cannot take


class Staging:
    """Contiguous stand-ins for tensors that are not contiguous, and the copies back once the
    collective completed. Contiguous tensors are used as they are: no copy."""

    def __init__(self) -> None:
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.contiguous()

    def output(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor the collective writes; copied into `t` by finish()."""
        if t.is_contiguous():
            return t
        c = t.contiguous()
        self._back.append((t, c))
        return c

    def copy_back(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copies `src` into `dst` once the collective completed (results computed elsewhere:
        a scaled copy, a slice of a flattened or gathered buffer)."""
        self._back.append((dst, src))

    def finish(self) -> Callable[[], None] | None:
        if not self._back:
            return None
        back = self._back

        def copy_back() -> None:
            for dst, src in back:
                dst.copy_(src)

        return copy_back
