"""Adapters from user tensors to the raw buffers the native core works on.

Accepted: numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), torch CPU tensors, and anything
with the buffer protocol or ``__dlpack__``. Results come back as the caller's type: numpy in,
numpy out; torch in, torch out.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._ext import _C

# Native dtype code -> name, as the extension numbers them (csrc/core/dtype.h).
DTYPE_NAMES: dict[int, str] = {code: name for name, code in _C.enum_codes()["dtype"].items()}
BFLOAT16 = _C.enum_codes()["dtype"]["bfloat16"]
# numpy dtype -> native dtype code; bfloat16 arrays need ml_dtypes.
_CODES: dict[np.dtype, int] = {
    np.dtype(name): code for code, name in DTYPE_NAMES.items() if name != "bfloat16"
}


@functools.lru_cache(maxsize=1)
def bf16_dtype() -> np.dtype | None:
    """numpy's bfloat16 (``ml_dtypes.bfloat16``), or None without ml_dtypes. Imported on first
    use, not with pycollective: the import takes most of a second, which every process of a job
    would pay at start-up (a program holding bfloat16 arrays has imported it already)."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
        return None
    dtype = np.dtype(ml_dtypes.bfloat16)
    _CODES[dtype] = BFLOAT16
    return dtype


SUPPORTED = "float16, bfloat16, float32, float64, int8, uint8, int32, int64"


def _same(a: np.ndarray) -> np.ndarray:
    return a


@dataclass(slots=True)
class Buffer:
    """A user tensor seen as a numpy array that shares its memory.

    ``array`` may be a uint16 view for bfloat16 when ml_dtypes is absent; ``code`` is the
    native dtype code either way. ``wrap`` turns a numpy result back into the caller's type.
    """

    array: np.ndarray
    code: int
    wrap: Callable[[np.ndarray], Any]
    source: Any

    @property
    def count(self) -> int:
        return self.array.size

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.code]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def _from_torch(t: Any, where: str) -> Buffer:
    import torch

    if t.device.type != "cpu":
        raise TypeError(
            f"{where}: torch tensor on {t.device}; this build handles CPU tensors (CUDA tensors "
            "need a CUDA build of pycollective)"
        )
    source = t  # results written in place are the caller's own tensor (written())
    t = t.detach()
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().view(np.uint16)
        bf16 = bf16_dtype()
        arr = raw.view(bf16) if bf16 is not None else raw

        def wrap(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)

        return Buffer(arr, BFLOAT16, wrap, source)
    try:
        arr = t.numpy()
    except TypeError as exc:
        raise TypeError(
            f"{where}: unsupported torch dtype {t.dtype}; supported: {SUPPORTED}"
        ) from exc
    return Buffer(arr, _code_of(arr.dtype, where), torch.from_numpy, source)


def written(buf: Buffer) -> Any:
    """The caller's own tensor, whose memory a call wrote (in place, or out=). A torch tensor's
    version counter moves on, as a torch in-place op's does: autograd then refuses a backward
    pass that saved the old values, instead of computing gradients from the new ones."""
    source = buf.source
    if type(source) is not np.ndarray and _is_torch(source):  # numpy first: every call's path
        import torch

        torch.autograd.graph.increment_version(source)
    return source


def _code_of(dtype: np.dtype, where: str) -> int:
    code = _CODES.get(np.dtype(dtype))
    if code is None and "bfloat16" in str(dtype) and bf16_dtype() is not None:
        code = _CODES.get(np.dtype(dtype))
    if code is None:
        hint = " (bfloat16 needs `pip install ml_dtypes`)" if "bfloat16" in str(dtype) else ""
        raise TypeError(f"{where}: unsupported dtype {dtype}; supported: {SUPPORTED}{hint}")
    return code


def adapt(x: Any, where: str) -> Buffer:
    """Returns a Buffer sharing memory with x. ``where`` names x in error messages."""
    if type(x) is np.ndarray:  # the common case first: this runs on every call
        code = _CODES.get(x.dtype)
        if code is not None:
            return Buffer(x, code, _same, x)
    if isinstance(x, np.ndarray):
        return Buffer(x, _code_of(x.dtype, where), _same, x)
    if _is_torch(x):
        return _from_torch(x, where)
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array_interface__"):
        arr = np.from_dlpack(x)
        return Buffer(arr, _code_of(arr.dtype, where), _same, x)
    try:
        arr = np.asarray(memoryview(x)) if not hasattr(x, "__array_interface__") else np.asarray(x)
    except TypeError as exc:
        raise TypeError(
            f"{where}: expected a numpy array, a torch CPU tensor, or an object with the buffer "
            f"protocol or __dlpack__, got {type(x).__name__}"
        ) from exc
    return Buffer(arr, _code_of(arr.dtype, where), _same, x)


def contiguous_input(buf: Buffer) -> np.ndarray:
    """The array as a C-contiguous input (a copy only when it is a strided view)."""
    return buf.array if buf.array.flags.c_contiguous else np.ascontiguousarray(buf.array)


def check_writable(buf: Buffer, where: str, inplace: bool = True) -> None:
    """The collective writes into the caller's memory (``inplace=True``, or an output array:
    ``out=``, a receive buffer): it must be writable and contiguous."""
    flags = buf.array.flags  # a new object per access: read it once
    if not flags.writeable:
        what = "inplace=True but the array" if inplace else "the output array"
        raise ValueError(f"{where}: {what} is read-only")
    if not flags.c_contiguous:
        # An output's contiguous copy would receive the result and be thrown away.
        fix = (
            "pass np.ascontiguousarray(x) or use inplace=False"
            if inplace
            else "pass one made with np.empty(shape, dtype) and copy from it"
        )
        what = "inplace=True needs" if inplace else "the output must be"
        raise ValueError(f"{where}: {what} a C-contiguous array, got a strided view; {fix}")


@functools.lru_cache(maxsize=1024)
def shape_hash(shape: tuple[int, ...]) -> int:
    """A 32-bit digest of a shape, carried in frame headers so that ranks passing the same
    element count in different shapes are told apart."""
    return zlib.crc32(repr(tuple(int(s) for s in shape)).encode()) & 0xFFFFFFFF
