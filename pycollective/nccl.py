"""NCCL through pycollective: communicators on CUDA devices, at two levels.

Raw level (CuPy's ``cupy.cuda.nccl`` style): pointers, counts, dtypes and streams as integers::

    uid = nccl.get_unique_id()                 # on rank 0, shared with the others
    comm = nccl.NcclCommunicator(nranks, uid, rank, device=0)
    comm.allreduce_ptr(send_ptr, recv_ptr, count, "float32", "sum", stream_ptr)

Array level: CuPy arrays and PyTorch CUDA tensors, on the array's current stream::

    y = comm.allreduce(x)                      # a new array; inplace=True / out= also work
    comms = nccl.NcclCommunicator.init_all([0, 1, 2, 3])   # one process, four GPUs
    with nccl.group():
        for c, x in zip(comms, xs):
            c.allreduce(x, inplace=True)

Collectives return once enqueued; results are ready in stream order. A watchdog per
communicator aborts it when a collective outlives ``timeout`` (``PYCOLLECTIVE_TIMEOUT``) or NCCL
reports an asynchronous error (a peer died), so nothing hangs; the next call, ``synchronize()``
or ``is_completed()`` raises why (:class:`CollectiveTimeout`, :class:`NcclError`, :class:`Aborted`).

NCCL is loaded at first use, never linked: from ``PYCOLLECTIVE_NCCL_LIBRARY`` when set (the
only candidate then), else an installed ``nvidia-nccl-cu13``/``-cu12`` wheel, else the system's
``libnccl.so.2``. When none works, :class:`NcclUnavailable` lists every path tried. In a process
group (``pc.init()``), ``algo="nccl"`` makes a communicator per group whose unique id travels
through the coordination service's key-value store.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from pycollective import config
from pycollective._calls import check_avg
from pycollective._ext import _C
from pycollective.config import default_timeout
from pycollective.device import (
    DeviceBuffer,
    adapt_device,
    prepare_device,
    stream_handle,
)
from pycollective.reduce_op import ReduceOp, parse_op
from pycollective.tensors import DTYPE_NAMES

__all__ = [
    "NcclCommunicator",
    "get_unique_id",
    "group",
    "group_end",
    "group_start",
    "init_all",
    "is_available",
    "library_info",
    "search_order",
]

UNIQUE_ID_BYTES = 128
_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
_DTYPE_CODES = {name: code for code, name in DTYPE_NAMES.items()}
_search_lock = threading.Lock()
_search_set = False


# ---- finding the library ----


def wheel_dirs() -> list[tuple[str, str]]:
    """(folder, origin) of each installed nvidia-nccl-cu* wheel that holds libnccl.so.2, the one
    matching this build's CUDA major version first."""
    wheels = list(_WHEELS)
    cuda_version = _C.build_info().get("cuda_version") or ""
    if cuda_version.startswith("12"):
        wheels.reverse()
    found: list[tuple[str, str]] = []
    for name in wheels:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name.startswith("libnccl.so"):
                folder = os.path.dirname(str(dist.locate_file(f)))
                if (folder, f"{name} wheel") not in found:
                    found.append((folder, f"{name} wheel"))
    if not found and importlib.util.find_spec("nvidia") is not None:
        # A wheel installed without metadata (vendored trees): nvidia/nccl/lib.
        spec = importlib.util.find_spec("nvidia.nccl")
        for location in (spec.submodule_search_locations or []) if spec else []:
            folder = os.path.join(location, "lib")
            if os.path.exists(os.path.join(folder, "libnccl.so.2")):
                found.append((folder, "nvidia.nccl package"))
    return found


def _ensure_search() -> None:
    global _search_set
    with _search_lock:
        if not _search_set:
            config.reload()
            _C.nccl_set_wheel_dirs(wheel_dirs())
            _search_set = True


def search_order() -> list[tuple[str, str]]:
    """The (path, origin) candidates for libnccl, in the order they are tried."""
    config.reload()  # looking for NCCL is a start-up: PYCOLLECTIVE_NCCL_LIBRARY as it is now
    return [tuple(c) for c in _C.nccl_search_order(wheel_dirs())]


def probe(dirs: Sequence[tuple[str, str]] | None = None) -> dict:
    """Tries the search order once (with `dirs` as the wheel folders, default: the installed
    wheels'), without keeping the library: for diagnostics and tests. Returns
    {version, version_code, path, origin}; raises NcclUnavailable listing every path tried."""
    config.reload()
    return dict(_C.nccl_probe(list(wheel_dirs() if dirs is None else dirs)))


def library_info() -> dict:
    """Loads NCCL (first call) and returns {version, version_code, path, origin}."""
    _ensure_search()
    return dict(_C.nccl_library())


def is_available() -> bool:
    """True when NCCL can be loaded (CUDA devices are a separate question)."""
    _ensure_search()
    return bool(_C.nccl_available())


def get_unique_id() -> bytes:
    """A new NCCL unique id (128 bytes): rank 0 makes it, every rank passes the same one."""
    _ensure_search()
    return bytes(_C.nccl_unique_id())


def group_start() -> None:
    """Starts fusing this thread's NCCL collectives (ncclGroupStart)."""
    _ensure_search()
    _C.nccl_group_start()


def group_end() -> None:
    """Launches the collectives issued since group_start() (ncclGroupEnd)."""
    _C.nccl_group_end()


@contextlib.contextmanager
def group() -> Iterator[None]:
    """``with nccl.group(): ...`` = group_start() ... group_end()."""
    group_start()
    try:
        yield
    finally:
        group_end()


def init_all(devices: Sequence[int], timeout: float | None = None) -> list[NcclCommunicator]:
    """One communicator per device of this process (rank i on devices[i])."""
    return NcclCommunicator.init_all(devices, timeout)


# ---- helpers ----


def _dtype_code(dtype: Any) -> int:
    """A native dtype code from a code, a name, a numpy/CuPy dtype or a torch dtype."""
    if isinstance(dtype, int):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype code {dtype}")
        return dtype
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).replace("torch.", "")
    else:
        import numpy as np

        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
    if name not in _DTYPE_CODES:
        raise TypeError(f"unsupported dtype {dtype!r}; supported: {', '.join(_DTYPE_CODES)}")
    return _DTYPE_CODES[name]


def _current_device() -> int:
    for probe_ in (_cupy_device, _torch_device):
        device = probe_()
        if device is not None:
            return device
    return 0


def _cupy_device() -> int | None:
    if importlib.util.find_spec("cupy") is None:
        return None
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def _torch_device() -> int | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return int(torch.cuda.current_device()) if torch.cuda.is_available() else None


def _timeout(timeout: float | None) -> float:
    return default_timeout() if timeout is None else float(timeout)


# ---- the communicator ----


class NcclCommunicator:
    """One rank of an NCCL communicator, on one CUDA device.

    Args:
        nranks: ranks in the communicator.
        unique_id: the 128 bytes of :func:`get_unique_id` (the same on every rank).
        rank: this rank, in [0, nranks).
        device: CUDA device (default: the current CuPy/PyTorch device, else 0).
        timeout: seconds init and each collective may take before the communicator is
            aborted (default ``PYCOLLECTIVE_TIMEOUT``).
    """

    def __init__(
        self,
        nranks: int,
        unique_id: bytes,
        rank: int,
        device: int | None = None,
        timeout: float | None = None,
        *,
        _native: Any = None,
    ) -> None:
        if _native is None:
            if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != UNIQUE_ID_BYTES:
                raise ValueError(
                    f"unique_id must be the {UNIQUE_ID_BYTES} bytes of get_unique_id()"
                )
            _ensure_search()
            _native = _C.NcclComm(
                nranks=int(nranks),
                unique_id=bytes(unique_id),
                rank=int(rank),
                device=_current_device() if device is None else int(device),
                timeout=_timeout(timeout),
            )
        self._native = _native
        # Fixed for the communicator's life; read on every array-level call, so kept here
        # rather than asked of the native object each time.
        self._rank, self._size, self._device = _native.rank, _native.size, _native.device
        self._where = f"nccl rank {self._rank}"

    @classmethod
    def init_all(
        cls, devices: Sequence[int], timeout: float | None = None
    ) -> list[NcclCommunicator]:
        """One communicator per device of this process, rank i on devices[i]."""
        _ensure_search()
        return [
            cls(0, b"", 0, _native=n)
            for n in _C.NcclComm.init_all(
                devices=[int(d) for d in devices], timeout=_timeout(timeout)
            )
        ]

    def __repr__(self) -> str:
        return f"NcclCommunicator{self._native!r}"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def device(self) -> int:
        return self._device

    @property
    def timeout(self) -> float:
        return self._native.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._native.timeout = float(seconds)

    # -- raw level: pointers, counts, dtypes, streams --

    def allreduce_ptr(
        self, send: int, recv: int, count: int, dtype: Any, op: Any = "sum", stream: Any = 0
    ) -> None:
        self._native.allreduce(
            send,
            recv,
            count,
            _dtype_code(dtype),
            int(parse_op(op)),
            stream_handle(stream),
        )

    def reduce_scatter_ptr(
        self, send: int, recv: int, recv_count: int, dtype: Any, op: Any = "sum", stream: Any = 0
    ) -> None:
        self._native.reduce_scatter(
            send,
            recv,
            recv_count,
            _dtype_code(dtype),
            int(parse_op(op)),
            stream_handle(stream),
        )

    def allgather_ptr(
        self, send: int, recv: int, send_count: int, dtype: Any, stream: Any = 0
    ) -> None:
        self._native.allgather(
            send,
            recv,
            send_count,
            _dtype_code(dtype),
            stream_handle(stream),
        )

    def broadcast_ptr(
        self, send: int, recv: int, count: int, dtype: Any, root: int = 0, stream: Any = 0
    ) -> None:
        self._native.broadcast(
            send,
            recv,
            count,
            _dtype_code(dtype),
            root,
            stream_handle(stream),
        )

    def reduce_ptr(
        self,
        send: int,
        recv: int,
        count: int,
        dtype: Any,
        op: Any = "sum",
        root: int = 0,
        stream: Any = 0,
    ) -> None:
        self._native.reduce(
            send,
            recv,
            count,
            _dtype_code(dtype),
            int(parse_op(op)),
            root,
            stream_handle(stream),
        )

    # -- array level: CuPy arrays and torch CUDA tensors --

    def allreduce(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        inplace: bool = False,
        out: Any = None,
        stream: Any = None,
    ) -> Any:
        """Every rank gets the reduction of all ranks' arrays."""
        return self._array("allreduce", x, op, 0, inplace, out, stream)

    def reduce_scatter(
        self, x: Any, op: str | ReduceOp = "sum", out: Any = None, stream: Any = None
    ) -> Any:
        """Rank r gets chunk r of the reduction (x.size must divide evenly by size)."""
        return self._array("reduce_scatter", x, op, 0, False, out, stream)

    def allgather(self, x: Any, out: Any = None, stream: Any = None) -> Any:
        """Every rank gets all ranks' arrays stacked: shape (size, *x.shape)."""
        return self._array("allgather", x, "sum", 0, False, out, stream)

    def broadcast(
        self, x: Any, root: int = 0, inplace: bool = False, out: Any = None, stream: Any = None
    ) -> Any:
        """Every rank gets rank ``root``'s array."""
        return self._array("broadcast", x, "sum", root, inplace, out, stream)

    def reduce(
        self,
        x: Any,
        root: int = 0,
        op: str | ReduceOp = "sum",
        inplace: bool = False,
        out: Any = None,
        stream: Any = None,
    ) -> Any:
        """Rank ``root`` gets the reduction; other ranks get None."""
        return self._array("reduce", x, op, root, inplace, out, stream)

    def _array(
        self, kind: str, x: Any, op: Any, root: int, inplace: bool, out: Any, stream: Any
    ) -> Any:
        where = self._where
        buf = adapt_device(x, where)
        reduce_op = parse_op(op)
        check_call(kind, buf, reduce_op, self._size, where)
        if buf.device != self._device:
            raise ValueError(
                f"{where}: the array is on cuda:{buf.device} but this "
                f"communicator is on cuda:{self._device}"
            )
        call = prepare_device(
            kind,
            buf,
            self._rank,
            self._size,
            root,
            inplace,
            where,
            None if out is None else adapt_device(out, f"{where} out="),
        )
        enqueue(
            self,
            kind,
            call.inp,
            call.out,
            reduce_op,
            root,
            buf.stream if stream is None else stream_handle(stream),
        )
        return call.result()

    # -- completion and failure --

    def synchronize(self, timeout: float | None = None) -> bool:
        """Waits for every collective enqueued so far; False if ``timeout`` elapsed first.
        Raises the communicator's failure (CollectiveTimeout, NcclError, Aborted)."""
        return self._native.synchronize(-1.0 if timeout is None else float(timeout))

    def is_completed(self) -> bool:
        return self._native.is_completed()

    def async_error(self) -> str | None:
        """NCCL's asynchronous error, described, or None while healthy."""
        return self._native.async_error() or None

    def abort(self, reason: str = "aborted by the user") -> None:
        """Aborts: running kernels end and every later call raises Aborted."""
        self._native.abort(reason)

    @property
    def aborted(self) -> bool:
        return self._native.aborted

    @property
    def failure(self) -> str | None:
        return self._native.failure or None


def check_call(kind: str, buf: DeviceBuffer, op: ReduceOp, size: int, where: str) -> None:
    """Argument checks NCCL would otherwise report less clearly."""
    check_avg(kind, op, buf.code, where)
    if kind == "reduce_scatter" and buf.count % size != 0:
        raise ValueError(
            f"{where}: NCCL's reduce_scatter needs a size divisible by the "
            f"{size} ranks, got {buf.count} elements"
        )


def enqueue(
    comm: NcclCommunicator,
    kind: str,
    inp: DeviceBuffer,
    out: DeviceBuffer | None,
    op: ReduceOp,
    root: int,
    stream: int,
) -> None:
    """Enqueues one prepared call on `comm` (out is None only for reduce off the root)."""
    native, code, count = comm._native, inp.code, inp.count
    recv = out.ptr if out is not None else inp.ptr
    if kind == "allreduce":
        native.allreduce(inp.ptr, recv, count, code, int(op), stream)
    elif kind == "reduce_scatter":
        native.reduce_scatter(inp.ptr, recv, count // comm.size, code, int(op), stream)
    elif kind == "allgather":
        native.allgather(inp.ptr, recv, count, code, stream)
    elif kind == "broadcast":
        native.broadcast(inp.ptr, recv, count, code, root, stream)
    elif kind == "reduce":
        native.reduce(inp.ptr, recv, count, code, int(op), root, stream)
    else:
        raise ValueError(f"NCCL has no {kind!r}")


# ---- process groups: one communicator per (group, device), id through the KV store ----


def group_communicator(group: Any, device: int) -> NcclCommunicator:
    """The NCCL communicator of a ProcessGroup on `device`, created on first use. Group rank 0
    makes the unique id and publishes it in the coordination service's key-value store; the
    other ranks read it from there. Every rank of the group must reach this point (it is
    reached by the group's first NCCL collective, which every rank calls)."""
    world = group._world
    cache = getattr(world, "nccl_comms", None)
    if cache is None:
        cache = world.nccl_comms = {}
    key = (group.group_id, device)
    comm = cache.get(key)
    if comm is not None:
        return comm
    # Every rank of the group makes its communicators in the same order (at the group's first
    # NCCL collective on a device), so a per-group count names the same one on every rank. The
    # device is not in the key: rank r usually runs on its own device.
    made = getattr(world, "nccl_made", None)
    if made is None:
        made = world.nccl_made = {}
    made[group.group_id] = made.get(group.group_id, 0) + 1
    members = "-".join(str(m) for m in group.members)
    store_key = f"pycollective/nccl/{group.group_id}/{members}/{made[group.group_id]}"
    if group.rank == 0:
        uid = get_unique_id()
        world.client.set(store_key, uid)
    else:
        uid = world.client.get(store_key, timeout=world.timeout)
    comm = NcclCommunicator(group.size, uid, group.rank, device=device, timeout=world.timeout)
    cache[key] = comm
    return comm


class NcclWork:
    """The Work of an asynchronous NCCL collective in a process group: ``wait()`` blocks the
    host until the collective's stream work finished (in stream order it already is)."""

    def __init__(self, comm: NcclCommunicator, result: Any, what: str) -> None:
        self._comm, self._result, self._what = comm, result, what

    def is_completed(self) -> bool:
        return self._comm.is_completed()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._comm.synchronize(timeout):
            from pycollective.errors import CollectiveTimeout

            raise CollectiveTimeout(f"{self._what} still running after wait(timeout={timeout})")
        return self._result
