"""Device tensors: CuPy arrays, PyTorch CUDA tensors, and anything else that exposes
``__cuda_array_interface__``.

A device tensor is seen as a raw pointer plus its CUDA device and the stream its work is
ordered on: the array's *current* stream (CuPy's current stream, PyTorch's current stream for
the tensor's device, or the interface's ``stream`` entry). Collectives wait for the work already
queued on that stream before reading the tensor, so results are correct without a manual
synchronize. Results come back as the caller's type (CuPy in, CuPy out; torch in, torch out).

Nothing here imports CuPy or PyTorch unless the caller passed one of their arrays, and nothing
calls the native extension's CUDA functions unless a device tensor reached it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective._calls import check_inplace_call, result_shape
from pycollective.errors import CudaError
from pycollective.tensors import DTYPE_NAMES, SUPPORTED

# __cuda_array_interface__ typestr -> native dtype code, and each code's item size (bfloat16,
# code BFLOAT16, has no typestr: it arrives through torch or DLPack).
_TYPESTR_CODES: dict[str, int] = {}
for _code, _name in DTYPE_NAMES.items():
    if _name != "bfloat16":
        _TYPESTR_CODES[np.dtype(_name).str] = _code
        if np.dtype(_name).itemsize == 1:  # '|i1'; some producers write '<i1'
            _TYPESTR_CODES["<" + np.dtype(_name).str[1:]] = _code
_ITEMSIZE = {
    code: (2 if name == "bfloat16" else np.dtype(name).itemsize)
    for code, name in DTYPE_NAMES.items()
}
_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


@dataclass(slots=True)
class DeviceBuffer:
    """One device tensor seen as memory: pointer, shape, dtype code, device, stream."""

    ptr: int
    shape: tuple[int, ...]
    code: int
    device: int
    stream: int
    source: Any  # the caller's object (returned for in-place results)
    kind: str  # "cupy", "torch" or "cai"
    contiguous: bool = True
    readonly: bool = False

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.code]

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.code]


class DeviceArray:
    """A minimal device array owned by pycollective (cudaMalloc through the native core), for
    tests and benchmarks on machines without CuPy or PyTorch, and for results of collectives on
    foreign ``__cuda_array_interface__`` inputs. Any dtype the collectives take, bfloat16
    included (as ``ml_dtypes.bfloat16``). ``DeviceArray.from_host(np_array)``, ``.get()``."""

    def __init__(self, shape: tuple[int, ...] | int, dtype: Any, device: int = 0) -> None:
        import numpy as np

        from pycollective._ext import _C
        from pycollective.tensors import _code_of

        self.shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.code = _code_of(self.dtype, "DeviceArray")
        self.device = int(device)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.ptr = 0
        self.ptr = int(_C.cuda_malloc(bytes=self.nbytes, device=self.device))
        self._free = _C.cuda_free

    def __del__(self) -> None:
        if getattr(self, "ptr", 0):
            self._free(self.ptr, self.device)
            self.ptr = 0

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    @classmethod
    def from_host(cls, array: Any, device: int = 0) -> DeviceArray:
        import numpy as np

        from pycollective._ext import _C

        host = np.ascontiguousarray(array)
        out = cls(host.shape, host.dtype, device)
        _C.cuda_copy(dst=out.ptr, src=host.ctypes.data, bytes=host.nbytes)
        _C.cuda_synchronize(stream=0)
        return out

    def get(self) -> Any:
        """A numpy copy (waits for the legacy default stream)."""
        import numpy as np

        from pycollective._ext import _C

        host = np.empty(self.shape, self.dtype)
        _C.cuda_copy(dst=host.ctypes.data, src=self.ptr, bytes=self.nbytes)
        _C.cuda_synchronize(stream=0)
        return host


@functools.cache
def build_has_cuda() -> bool:
    """Whether this build of the extension has CUDA (``pycollective.build_info()["cuda"]``)."""
    from pycollective._ext import _C

    return bool(_C.build_info()["cuda"])


def is_device_tensor(x: Any) -> bool:
    """True for CuPy arrays, PyTorch CUDA tensors and other CUDA-interface objects."""
    if type(x).__module__.startswith("torch"):
        return bool(getattr(x, "is_cuda", False))
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None and not hasattr(x, "__array_interface__"):
        try:
            return dlpack_device()[0] in _DLPACK_CUDA
        except (TypeError, ValueError, AttributeError, RuntimeError):  # pragma: no cover
            return False
    return False


def stream_handle(stream: Any) -> int:
    """A cudaStream_t as an integer from an int, a CuPy stream (``.ptr``) or a PyTorch stream
    (``.cuda_stream``). 0 is the legacy default stream."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(
        f"expected a CUDA stream (an int handle, a cupy or torch stream), got "
        f"{type(stream).__name__}"
    )


@functools.cache
def _torch_codes() -> dict:
    import torch

    return {
        torch.float16: 0,
        torch.bfloat16: 1,
        torch.float32: 2,
        torch.float64: 3,
        torch.int8: 4,
        torch.uint8: 5,
        torch.int32: 6,
        torch.int64: 7,
    }


@functools.cache
def _torch_current_stream() -> Callable[[int], int]:
    """device index -> the cudaStream_t of torch's current stream there. torch's raw query
    where it has one (what its own compiled kernels use): the public
    ``torch.cuda.current_stream(device).cuda_stream`` builds a Stream object per call, a few
    microseconds of a collective's Python."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def _from_torch(t: Any, where: str) -> DeviceBuffer:
    code = _torch_codes().get(t.dtype)
    if code is None:
        raise TypeError(f"{where}: unsupported torch dtype {t.dtype}; supported: {SUPPORTED}")
    t = t.detach()
    stream = _torch_current_stream()(t.device.index)
    return DeviceBuffer(
        t.data_ptr(), tuple(t.shape), code, t.device.index, stream, t, "torch", t.is_contiguous()
    )


def _from_cupy(a: Any, where: str) -> DeviceBuffer:
    import cupy

    from pycollective.tensors import _code_of

    code = _code_of(a.dtype, where)
    with a.device:
        stream = cupy.cuda.get_current_stream().ptr
    return DeviceBuffer(
        a.data.ptr, tuple(a.shape), code, a.device.id, stream, a, "cupy", bool(a.flags.c_contiguous)
    )


def _from_interface(x: Any, where: str) -> DeviceBuffer:
    from pycollective._ext import _C

    cai = x.__cuda_array_interface__
    code = _TYPESTR_CODES.get(cai["typestr"])
    if code is None:
        raise TypeError(
            f"{where}: unsupported dtype {cai['typestr']!r} in "
            f"__cuda_array_interface__; supported: {SUPPORTED}"
        )
    shape = tuple(int(s) for s in cai["shape"])
    ptr, readonly = cai["data"]
    strides = cai.get("strides")
    contiguous = True
    if strides is not None:
        expected, step = [], _ITEMSIZE[code]
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        contiguous = tuple(reversed(expected)) == tuple(strides) or math.prod(shape) <= 1
    if not build_has_cuda():
        # Every pointer looks like host memory to a build without CUDA: say what is missing.
        raise CudaError(
            f"{where}: {type(x).__name__} is a CUDA array (it has __cuda_array_interface__), "
            "but this build of pycollective has no CUDA (built with PYCOLLECTIVE_CUDA=OFF, or "
            "AUTO without nvcc); rebuild with PYCOLLECTIVE_CUDA=ON and the CUDA toolkit on "
            "PATH (docs/building.md), or pass host arrays"
        )
    device = _C.cuda_pointer_device(ptr=ptr) if ptr else 0
    if ptr and device < 0:
        raise TypeError(f"{where}: __cuda_array_interface__ points at host memory")
    stream = cai.get("stream") or 0  # None: no synchronization needed
    return DeviceBuffer(
        int(ptr), shape, code, max(device, 0), int(stream), x, "cai", contiguous, bool(readonly)
    )


def adapt_device(x: Any, where: str) -> DeviceBuffer:
    """The DeviceBuffer of a device tensor; TypeError for anything else."""
    if isinstance(x, DeviceArray):
        return DeviceBuffer(x.ptr, x.shape, x.code, x.device, 0, x, "pc")
    module = type(x).__module__
    if module.startswith("torch") and getattr(x, "is_cuda", False):
        return _from_torch(x, where)
    if module.startswith("cupy"):
        return _from_cupy(x, where)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_interface(x, where)
    if is_device_tensor(x):  # DLPack only: borrow it through CuPy, zero-copy
        try:
            import cupy
        except ImportError:
            raise TypeError(
                f"{where}: a CUDA DLPack tensor ({type(x).__name__}) needs CuPy "
                "installed to be read; pass a CuPy array or a torch tensor"
            ) from None
        buf = _from_cupy(cupy.from_dlpack(x), where)
        return buf
    raise TypeError(
        f"{where}: expected a device tensor (a CuPy array or a PyTorch CUDA "
        f"tensor), got {type(x).__name__}"
    )


# ---- allocation and contiguity, in the caller's library ----


def empty_like(buf: DeviceBuffer, shape: tuple[int, ...], where: str) -> DeviceBuffer:
    """A new tensor of `shape` with buf's dtype, device and library."""
    if buf.kind == "torch":
        import torch

        t = torch.empty(shape, dtype=buf.source.dtype, device=buf.source.device)
        return _from_torch(t, where)
    if buf.kind in ("pc", "cai"):  # our own allocation (no CuPy needed)
        import numpy as np

        from pycollective.tensors import bf16_dtype

        dtype = bf16_dtype() if buf.code == 1 else np.dtype(DTYPE_NAMES[buf.code])
        if dtype is None:
            raise TypeError(f"{where}: bfloat16 results need `pip install ml_dtypes`")
        return adapt_device(DeviceArray(shape, dtype, buf.device), where)
    try:
        import cupy
    except ImportError:
        raise TypeError(
            f"{where}: cannot allocate a result for {type(buf.source).__name__} "
            "without CuPy; pass out= (or inplace=True)"
        ) from None
    import numpy as np

    dtype = {
        0: np.float16,
        2: np.float32,
        3: np.float64,
        4: np.int8,
        5: np.uint8,
        6: np.int32,
        7: np.int64,
    }.get(buf.code)
    if dtype is None:
        raise TypeError(f"{where}: CuPy has no {buf.dtype_name}; pass out= (or inplace=True)")
    with cupy.cuda.Device(buf.device):
        return _from_cupy(cupy.empty(shape, dtype=dtype), where)


def contiguous(buf: DeviceBuffer, where: str) -> DeviceBuffer:
    """buf itself when contiguous, else a contiguous copy (made on the current stream)."""
    if buf.contiguous:
        return buf
    if buf.kind == "torch":
        return _from_torch(buf.source.contiguous(), where)
    if buf.kind == "cupy":
        import cupy

        with buf.source.device:
            return _from_cupy(cupy.ascontiguousarray(buf.source), where)
    raise ValueError(f"{where}: the tensor is strided; pass a contiguous one")


# ---- one rank's buffers for one call (the device twin of _calls.prepare) ----


@dataclass
class DevicePrepared:
    inp: DeviceBuffer
    out: DeviceBuffer | None  # None: this rank gets no result (reduce at a non-root)
    caller: DeviceBuffer  # the caller's tensor (for in-place results)

    def result(self) -> Any:
        if self.out is None:
            return None
        return self.caller.source if self.out is self.caller else self.out.source


def prepare_device(
    kind: str,
    buf: DeviceBuffer,
    rank: int,
    size: int,
    root: int,
    inplace: bool,
    where: str,
    out: DeviceBuffer | None = None,
) -> DevicePrepared:
    """Checks one rank's device tensor for `kind` and allocates (or checks) its output."""
    if inplace:
        check_inplace_call(kind, out, where)
        if buf.readonly:
            raise ValueError(f"{where}: inplace=True but the tensor is read-only")
        if not buf.contiguous:
            raise ValueError(f"{where}: inplace=True needs a contiguous tensor")
    inp = contiguous(buf, where)
    shape = result_shape(kind, inp.shape, inp.count, rank, size, root)
    if shape is None:
        return DevicePrepared(inp, None, buf)
    if inplace:
        return DevicePrepared(inp, buf, buf)
    if out is None:
        return DevicePrepared(inp, empty_like(inp, shape, where), buf)
    if out.code != buf.code:
        raise TypeError(
            f"{where}: out= has dtype {out.dtype_name} but the input has {buf.dtype_name}"
        )
    if out.shape != shape:
        raise ValueError(
            f"{where}: out= has shape {out.shape}; the result of {kind} has shape {shape}"
        )
    if out.device != buf.device:
        raise ValueError(f"{where}: out= is on device {out.device}, the input on {buf.device}")
    if out.readonly or not out.contiguous:
        raise ValueError(f"{where}: out= must be writable and contiguous")
    return DevicePrepared(inp, out, out)
