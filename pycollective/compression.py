"""Compressed gradients: the rounding a ``compress=`` call applies, and error feedback.

``pycollective.allreduce(x, compress="bf16")`` sends float32 values over network links as
bfloat16 (``"fp16"``: IEEE half) and sums them in float32; every rank's result is rounded alike
to that precision. Over many training steps the rounding of each step's gradients can add up to
a bias. Error feedback (as in 1-bit SGD and EF-SGD) keeps what the rounding removed and adds it
to the next step's gradient before that is sent::

    feedback = pycollective.ErrorFeedback("bf16")
    for step in ...:
        g = flat_gradients()                  # float32, contiguous, same shape every step
        feedback.add_residue("grads", g)       # g += residue; residue = g - round(g)
        pycollective.allreduce(g, inplace=True, compress="bf16")
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pycollective._calls import wire_code
from pycollective._ext import _C

__all__ = ["ErrorFeedback", "round_to_wire"]


def _check_in_place_float32(x: Any, what: str) -> None:
    """``what`` changes ``x`` in place: a writable, contiguous float32 numpy array."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(
            f"{what} takes a contiguous float32 numpy array, got {type(x).__name__} "
            f"of {getattr(x, 'dtype', '?')}"
        )
    if not x.flags.writeable:
        raise ValueError(f"{what} works in place: the array is read-only")


def round_to_wire(x: np.ndarray, compress: str) -> np.ndarray:
    """``x`` (a contiguous float32 array) rounded in place to the 16-bit values a call with
    ``compress=`` sends for it -- the collectives' own kernel; returns ``x``."""
    _check_in_place_float32(x, "round_to_wire")
    _C.round_to_wire(x, x.size, wire_code(compress, "round_to_wire"))
    return x


class ErrorFeedback:
    """Per-tensor rounding residues for compressed all-reduces (one instance per training
    loop; keys name the tensors, e.g. a gradient bucket's index)."""

    def __init__(self, compress: str) -> None:
        wire_code(compress, "ErrorFeedback")
        if compress is None:
            raise ValueError("ErrorFeedback needs a 16-bit format: 'bf16' or 'fp16'")
        self.compress = compress
        self._residues: dict[object, np.ndarray] = {}

    def add_residue(self, key: object, x: np.ndarray) -> None:
        """In place: ``x += residue[key]``, then ``residue[key] = x - round(x)``, the part of
        ``x`` the compressed call about to send it will drop."""
        # Checked before anything changes: a refused x must leave x and the residue as they were.
        _check_in_place_float32(x, "ErrorFeedback.add_residue")
        residue = self._residues.get(key)
        if residue is None or residue.shape != x.shape:
            residue = self._residues[key] = np.zeros(x.shape, np.float32)
        np.add(x, residue, out=x)
        np.copyto(residue, x)
        residue -= round_to_wire(np.array(x, copy=True), self.compress)

    def reset(self) -> None:
        """Forgets every residue (e.g. after restoring a checkpoint)."""
        self._residues.clear()
