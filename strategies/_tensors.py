"""Framework-agnostic tensors: numpy arrays, and torch CPU tensors where torch is installed.

Collectives work on numpy arrays that share memory with the caller's tensors; results go back in
the caller's type (numpy in, numpy out; torch in, torch out). Python scalars and lists become
numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def to_numpy(x: Any, where: str = "value") -> np.ndarray:
    """``x`` as a numpy array, sharing memory when ``x`` is a numpy array or a torch CPU
    tensor."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        if x.device.type != "cpu":
            raise TypeError(
                f"{where}: torch tensor on {x.device}; the strategies keep their "
                "variables in host memory: move it with .cpu()"
            )
        try:
            return x.detach().numpy()
        except TypeError as exc:
            raise TypeError(
                f"{where}: torch dtype {x.dtype} has no numpy equivalent; convert "
                "it (e.g. .float()) first"
            ) from exc
    try:
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(
            f"{where}: expected a numpy array, a torch CPU tensor or a number, got "
            f"{type(x).__name__}"
        ) from exc


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array of the same shape (``np.ascontiguousarray`` would turn a
    0-d array into shape (1,))."""
    return a if a.flags.c_contiguous else np.array(a, order="C", copy=True)


def like(result: np.ndarray, template: Any) -> Any:
    """``result`` in the framework of ``template``."""
    if is_torch(template):
        import torch

        return torch.from_numpy(contiguous(np.asarray(result)))
    return result


def describe(a: np.ndarray) -> str:
    return f"{a.dtype}{list(a.shape)}"
