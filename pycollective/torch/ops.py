"""What torch passes a backend, in pycollective's terms: reduction ops, contiguous buffers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

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
