"""CUDA kernels, collectives on device buffers, and NCCL (run by bench/gpu_check.sh on a GPU
machine; every test here skips with its reason when the build has no CUDA, there is no device,
or NCCL / CuPy / PyTorch is missing).

Device memory comes from pycollective.device.DeviceArray (cudaMalloc through the native core),
so the core checks need neither CuPy nor PyTorch; CuPy and PyTorch get their own interop tests.

The strongest check available is bitwise: the device kernels implement the CPU table's exact
semantics (fp16/bf16 through float rounded once, integer wrap, NaN-propagating min/max), and the
algorithms on device buffers run the same schedules in the same order as on host buffers, so a
device result must equal the host result byte for byte.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from reference import ALL_DTYPES, BF16, FLOATS, OPS, make_inputs, reduce_ref

import pycollective as pc
from pycollective._ext import _C
from pycollective.device import DeviceArray, adapt_device, prepare_device

OP_CODES = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
DTYPE_CODES = {name: i for i, name in enumerate(ALL_DTYPES)}
ALGOS = ["ring", "halving_doubling", "hierarchical", "reduce_to_one", "direct", "auto"]
KINDS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]


def _skip_reason() -> str | None:
    if not pc.build_info()["cuda"]:
        return "this build has no CUDA (PYCOLLECTIVE_CUDA=OFF, or AUTO without nvcc)"
    if _C.cuda_device_count() == 0:
        return "no CUDA device (" + _C.cuda_describe() + ")"
    if BF16 is None:
        return "needs ml_dtypes"
    return None


@pytest.fixture(scope="module")
def gpu() -> int:
    """The number of CUDA devices (skips without one)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    return _C.cuda_device_count()


@pytest.fixture(scope="module")
def cp(gpu):
    try:
        import cupy
    except ImportError:
        pytest.skip("needs CuPy (pip install pycollective[cuda12] or [cuda13])")
    return cupy


@pytest.fixture(scope="module")
def torch_cuda(gpu):
    try:
        import torch
    except ImportError:
        pytest.skip("needs PyTorch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    return torch


def _raw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


def _host(x) -> np.ndarray:
    return x.get() if isinstance(x, DeviceArray) else x


# ---- kernels ----


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduce_kernels_match_the_cpu_bitwise(gpu, dtype, op):
    if op == "avg" and dtype not in FLOATS:
        with pytest.raises(TypeError):
            _C.cuda_reduce(0, 0, 0, 1, DTYPE_CODES[dtype], OP_CODES[op], 0)
        return
    code, opc = DTYPE_CODES[dtype], OP_CODES[op]
    for count in [0, 1, 7, 4099, (1 << 20) + 3]:
        a, b = make_inputs(dtype, op, 2, count + 8, seed=count)
        es = a.dtype.itemsize
        # offsets (elements) of dst, a, b: aligned; equally misaligned (head peel); unequal
        # (scalar path); dst aliasing a
        for off_d, off_a, off_b, alias in [
            (0, 0, 0, False),
            (1, 1, 1, False),
            (3, 1, 2, False),
            (0, 0, 0, True),
        ]:
            ha, hb = _raw(a), _raw(b)
            da, db = DeviceArray.from_host(ha), DeviceArray.from_host(hb)
            dd = da if alias else DeviceArray.from_host(np.zeros_like(ha))
            hd = ha.copy() if alias else np.zeros_like(ha)
            hsrc = hd if alias else ha
            _C.cuda_reduce(
                dd.ptr + off_d * es, da.ptr + off_a * es, db.ptr + off_b * es, count, code, opc, 0
            )
            _C.reduce_into(
                hd.ctypes.data + off_d * es,
                hsrc.ctypes.data + off_a * es,
                hb.ctypes.data + off_b * es,
                count,
                code,
                opc,
            )
            assert dd.get().tobytes() == hd.tobytes(), (
                f"{dtype} {op} count={count} offsets={(off_d, off_a, off_b)} alias={alias}"
            )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_propagate_nan(gpu, dtype, op):
    a, b = make_inputs(dtype, op, 2, 1001, seed=5)
    a[::7] = np.nan
    b[::11] = np.nan
    da, db = DeviceArray.from_host(a), DeviceArray.from_host(b)
    dd = DeviceArray(a.shape, a.dtype)
    _C.cuda_reduce(dd.ptr, da.ptr, db.ptr, a.size, DTYPE_CODES[dtype], OP_CODES[op], 0)
    want = reduce_ref([a, b], op)
    got = dd.get()
    nan_got = np.isnan(got.astype(np.float64))
    assert np.array_equal(nan_got, np.isnan(want.astype(np.float64)))
    assert got[~nan_got].tobytes() == want[~nan_got].tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_scale_kernels_match_the_cpu_bitwise(gpu, dtype):
    (x,) = make_inputs(dtype, "sum", 1, 100003, seed=3)
    hx = _raw(x).copy()
    dx = DeviceArray.from_host(hx)
    es = x.dtype.itemsize
    _C.cuda_scale(dx.ptr + es, x.size - 1, DTYPE_CODES[dtype], 1 / 3, 0)
    _C.scale(hx.ctypes.data + es, x.size - 1, DTYPE_CODES[dtype], 1 / 3)
    assert dx.get().tobytes() == hx.tobytes()
    with pytest.raises(TypeError):
        _C.cuda_scale(dx.ptr, 1, DTYPE_CODES["int32"], 0.5, 0)


@pytest.mark.gpu
def test_pointer_query(gpu):
    x = DeviceArray(10, np.float32, device=gpu - 1)
    assert _C.cuda_pointer_device(x.ptr) == gpu - 1
    assert _C.cuda_pointer_device(np.zeros(10).ctypes.data) == -1


# ---- collectives on device buffers (LocalCommunicator) ----


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("algo", ALGOS)
def test_device_collectives_equal_host_collectives(gpu, n, algo, monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_DEVICE_SEGMENT_BYTES", "40")  # many segments per chunk
    monkeypatch.setenv("PYCOLLECTIVE_SEGMENT_BYTES", "40")
    c = pc.LocalCommunicator(n, timeout=60)
    kinds = ["allreduce"] if algo == "hierarchical" else list(KINDS)
    if algo == "halving_doubling" and n & (n - 1):
        kinds.remove("reduce_scatter")
    for dtype in ALL_DTYPES:
        for op in OPS:
            if op == "avg" and dtype not in FLOATS:
                continue
            for count in [0, 1, 7, 1009]:
                xs = make_inputs(dtype, op, n, count, seed=count + n)
                dxs = [DeviceArray.from_host(x) for x in xs]
                for kind in kinds:
                    kw = {} if kind in ("allgather", "broadcast") else {"op": op}
                    if kind in ("broadcast", "reduce"):
                        kw["root"] = n - 1
                    got = getattr(c, kind)(dxs, algo=algo, **kw)
                    what = f"{kind} {algo} n={n} {dtype} {op} count={count}"
                    assert all(isinstance(g, DeviceArray) or g is None for g in got), what
                    got_bytes = [None if g is None else g.get().tobytes() for g in got]
                    assert got_bytes in _host_results(c, kind, xs, algo, kw), what


def _host_results(c, kind: str, xs: list, algo: str, kw: dict) -> list:
    """Each replica's bytes from the same call on host buffers. For "auto": one such list per
    named algorithm that can run the call, since auto may pick differently for host buffers
    (`inline` and `slots` serve host memory only) and float sums in another order round
    differently; auto on the device must still equal one of them, every replica alike."""
    names = [a for a in ALGOS if a != "auto"] if algo == "auto" else [algo]
    results = []
    for name in names:
        try:
            want = getattr(c, kind)(xs, algo=name, **kw)
        except ValueError:  # this algorithm cannot run the call (e.g. hierarchical reduce)
            continue
        results.append([None if w is None else w.tobytes() for w in want])
    return results


@pytest.mark.gpu
def test_device_inplace_and_out(gpu):
    c = pc.LocalCommunicator(3, timeout=60)
    xs = [DeviceArray.from_host(np.full(1000, i + 1, np.float32)) for i in range(3)]
    outs = [DeviceArray(1000, np.float32) for _ in range(3)]
    res = c.allreduce(xs, out=outs)
    assert all(r is o for r, o in zip(res, outs))
    assert all(float(o.get()[0]) == 6.0 for o in outs)
    res = c.allreduce(xs, inplace=True, algo="direct")
    assert all(r is x for r, x in zip(res, xs))
    assert all(float(x.get()[-1]) == 6.0 for x in xs)


@pytest.mark.gpu
def test_replicas_on_several_devices(gpu):
    if gpu < 2:
        pytest.skip("needs 2 CUDA devices")
    c = pc.LocalCommunicator(gpu, timeout=60)
    xs = [DeviceArray.from_host(np.full(1 << 20, d + 1, np.float32), device=d) for d in range(gpu)]
    ys = c.allreduce(xs, algo="ring")
    assert [y.device for y in ys] == list(range(gpu))
    assert all(float(y.get()[-1]) == gpu * (gpu + 1) / 2 for y in ys)


@pytest.mark.gpu
def test_mixing_host_and_device_replicas_is_refused(gpu):
    c = pc.LocalCommunicator(2, timeout=30)
    with pytest.raises(TypeError, match="device tensor"):
        c.allreduce([DeviceArray(4, np.float32), np.ones(4, np.float32)])


@pytest.mark.gpu
def test_cupy_arrays_and_the_current_stream(cp):
    """CuPy in, CuPy out; inputs written by kernels still queued on a non-default stream are
    read only after them (the call waits for the array's current stream)."""
    c = pc.LocalCommunicator(2, timeout=60)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        base = cp.ones(1 << 24, cp.float32)
        xs = [base * 2, base * 3]  # queued on `stream`
        ys = c.allreduce(xs, algo="ring")
        zs = c.allgather([x[:5] for x in xs])
    assert isinstance(ys[0], cp.ndarray)
    assert float(ys[0][-1]) == 5.0 and float(ys[1][0]) == 5.0
    assert zs[0].shape == (2, 5) and float(zs[1][1, 0]) == 3.0


@pytest.mark.gpu
def test_torch_cuda_tensors_including_bfloat16(torch_cuda):
    torch = torch_cuda
    c = pc.LocalCommunicator(2, timeout=60)
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int64):
        xs = [torch.arange(1000, device="cuda").to(dtype) * (i + 1) for i in range(2)]
        ys = c.allreduce(xs, algo="ring")
        want = c.allreduce([x.cpu() for x in xs], algo="ring")
        assert ys[0].is_cuda and ys[0].dtype == dtype
        assert torch.equal(ys[0].cpu(), want[0]) and torch.equal(ys[1].cpu(), want[1])


# ---- NCCL ----


@pytest.fixture(scope="module")
def nccl_gpu(gpu):
    try:
        pc.nccl.library_info()
    except pc.NcclUnavailable as e:
        pytest.skip(f"NCCL not found: {e}")
    return gpu


@pytest.mark.gpu
@pytest.mark.nccl
def test_single_rank_nccl_collectives(nccl_gpu):
    comm = pc.nccl.NcclCommunicator(1, pc.nccl.get_unique_id(), 0, device=0, timeout=60)
    h = np.arange(1001, dtype=np.float32)
    x = DeviceArray.from_host(h)
    assert np.array_equal(comm.allreduce(x).get(), h)
    assert np.array_equal(comm.allreduce(x, op="avg").get(), h)
    assert comm.allgather(x).get().shape == (1, 1001)
    assert np.array_equal(comm.broadcast(x, root=0).get(), h)
    assert np.array_equal(comm.reduce(x, root=0, op="max").get(), h)
    x1000 = DeviceArray.from_host(h[:1000])
    assert np.array_equal(comm.reduce_scatter(x1000).get(), h[:1000])
    y = DeviceArray(h.shape, h.dtype)
    comm.allreduce_ptr(x.ptr, y.ptr, x.size, "float32", "sum", 0)
    assert comm.synchronize(timeout=60)
    assert np.array_equal(y.get(), h)
    b = DeviceArray.from_host(np.ones(64, BF16))
    assert np.array_equal(comm.allreduce(b).get().astype(np.float32), np.ones(64, np.float32))
    assert comm.async_error() is None and comm.is_completed()
    with pytest.raises(TypeError, match="avg"):
        comm.allreduce(DeviceArray(4, np.int32), op="avg")
    with pytest.raises(ValueError, match="divisible"):
        pc.nccl.check_call(
            "reduce_scatter", adapt_device(DeviceArray(3, np.float32), "x"), pc.ReduceOp.SUM, 2, "x"
        )
    comm.abort("test abort")
    with pytest.raises(pc.Aborted, match="test abort"):
        comm.allreduce(x)


@pytest.mark.gpu
@pytest.mark.nccl
def test_init_all_groups_and_local_communicator(nccl_gpu):
    devices = list(range(nccl_gpu))
    comms = pc.nccl.NcclCommunicator.init_all(devices, timeout=60)
    xs = [DeviceArray.from_host(np.full(4096, d + 1, np.float32), device=d) for d in devices]
    with pc.nccl.group():
        for comm, x in zip(comms, xs):
            comm.allreduce(x, inplace=True)
    total = sum(d + 1 for d in devices)
    for comm, x in zip(comms, xs):
        assert comm.synchronize(timeout=60)
        assert float(x.get()[0]) == total
    lc = pc.LocalCommunicator(len(devices), timeout=60)
    ys = lc.allreduce(xs, algo="nccl")
    assert all(float(y.get()[-1]) == total * len(devices) for y in ys)


@pytest.mark.gpu
@pytest.mark.nccl
def test_init_that_never_completes_times_out(nccl_gpu):
    """Rank 0 of 2 with no rank 1: init fails with CollectiveTimeout instead of hanging."""
    t = time.monotonic()
    with pytest.raises(pc.CollectiveTimeout, match="init"):
        pc.nccl.NcclCommunicator(2, pc.nccl.get_unique_id(), 0, device=0, timeout=3)
    assert time.monotonic() - t < 30


def _pg_nccl(rank: int, world: int) -> list:
    import numpy as np

    import pycollective as pc
    from pycollective.device import DeviceArray

    pc.init()
    x = DeviceArray.from_host(np.full(1 << 20, rank + 1, np.float32), device=rank)
    y = pc.allreduce(x, algo="nccl")
    z = pc.allreduce(x, op="avg")  # algo="auto" on a device tensor: NCCL
    w = pc.allreduce_async(x, algo="nccl").wait(timeout=60)
    g = pc.allgather(x)
    out = [float(y.get()[0]), float(z.get()[-1]), float(w.get()[0]), g.shape[0]]
    pc.shutdown()
    return out


@pytest.mark.gpu
@pytest.mark.nccl
def test_process_group_nccl(nccl_gpu):
    """The unique id travels through the coordination service (one GPU per rank)."""
    from multiproc import run_ranks

    n = min(2, nccl_gpu)
    total = sum(range(1, n + 1))
    assert run_ranks(_pg_nccl, n, timeout=120) == [[total, total / n, total, n]] * n


def _pg_nccl_hang(rank: int, world: int) -> str:
    import time

    import numpy as np

    import pycollective as pc
    from pycollective.device import DeviceArray

    pc.init(timeout=5)
    x = DeviceArray.from_host(np.ones(1 << 20, np.float32), device=rank)
    pc.allreduce(x, algo="nccl")
    if rank == 1:
        time.sleep(20)  # never calls the second allreduce
        return "skipped"
    comm = pc.nccl.group_communicator(pc.process_group._default(), rank)
    try:
        pc.allreduce(x, algo="nccl")
        comm.synchronize()
        return "no error"
    except pc.CollectiveTimeout as e:
        return "timeout" if "did not finish" in str(e) else str(e)


@pytest.mark.gpu
@pytest.mark.nccl
def test_watchdog_aborts_a_collective_that_never_finishes(nccl_gpu):
    if nccl_gpu < 2:
        pytest.skip("needs 2 CUDA devices (NCCL wants one GPU per rank)")
    from multiproc import run_ranks

    assert run_ranks(_pg_nccl_hang, 2, timeout=90)[0] == "timeout"


# ---- without a device: the Python side of the device path, and clean failures ----
# These run everywhere (no marker): a host buffer dressed up as device memory walks the device
# path down to the native call, which must fail with a CollectiveError subclass, not hang or
# crash, in a CPU-only build and in a CUDA build on a machine without a GPU.


class FakeDeviceTensor:
    """__cuda_array_interface__ over host memory (reported as device 0 by a patched query)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self.array
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.ctypes.data, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


@pytest.fixture
def no_device(monkeypatch):
    if _C.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present: the GPU tests cover this path")
    monkeypatch.setattr(_C, "cuda_pointer_device", lambda ptr: 0)
    # A CPU-only build refuses CUDA arrays up front (test below); these tests walk the device
    # path down to the native call, which fails there instead.
    monkeypatch.setattr("pycollective.device.build_has_cuda", lambda: True)


def test_device_tensors_are_recognized():
    from pycollective.device import is_device_tensor

    assert is_device_tensor(FakeDeviceTensor(np.zeros(3, np.float32)))
    assert not is_device_tensor(np.zeros(3))
    assert not is_device_tensor(memoryview(b"abc"))
    try:
        import torch
    except ImportError:
        return
    assert not is_device_tensor(torch.zeros(3))


def test_device_collective_without_a_device_fails_cleanly(no_device):
    c = pc.LocalCommunicator(3, timeout=30)
    xs = [FakeDeviceTensor(np.ones(1000, np.float32)) for _ in range(3)]
    t = time.monotonic()
    with pytest.raises(pc.CudaError):
        c.allreduce(xs, inplace=True, algo="ring")
    assert (
        time.monotonic() - t < 25
    )  # every replica was released, nobody waited for the 30 s timeout
    with pytest.raises(pc.CudaError):  # allocating a result needs a device too
        pc.LocalCommunicator(2, timeout=30).allreduce(xs[:2])


@pytest.mark.skipif(_C.build_info()["cuda"], reason="a CUDA build reads CUDA arrays")
def test_a_cpu_only_build_says_it_has_no_cuda_for_a_cuda_array():
    # Its pointer query calls every pointer host memory; the message must name the build.
    c = pc.LocalCommunicator(2, timeout=30)
    xs = [FakeDeviceTensor(np.ones(4, np.float32)) for _ in range(2)]
    with pytest.raises(
        pc.CudaError,
        match=r"replica 0: FakeDeviceTensor is a CUDA array.*"
        r"has no CUDA.*PYCOLLECTIVE_CUDA=ON",
    ):
        c.allreduce(xs)


def test_device_argument_errors_come_before_any_device_work(no_device):
    c = pc.LocalCommunicator(2, timeout=30)
    f32 = FakeDeviceTensor(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="same dtype"):
        c.allreduce([f32, FakeDeviceTensor(np.ones(4, np.float64))], inplace=True)
    with pytest.raises(ValueError, match="same shape"):
        c.allreduce([f32, FakeDeviceTensor(np.ones(5, np.float32))], inplace=True)
    with pytest.raises(TypeError, match="avg"):
        i32 = FakeDeviceTensor(np.ones(4, np.int32))
        c.allreduce([i32, i32], op="avg", inplace=True)
    with pytest.raises(ValueError, match="inplace"):
        prepare_device("allgather", adapt_device(f32, "x"), 0, 2, 0, True, "x")
    with pytest.raises(TypeError, match="device tensor"):
        c.allreduce([np.ones(4, np.float32)] * 2, algo="nccl")


def test_nccl_on_device_tensors_without_nccl_or_device(no_device, monkeypatch, tmp_path):
    c = pc.LocalCommunicator(2, timeout=30)
    xs = [FakeDeviceTensor(np.ones(4, np.float32)) for _ in range(2)]
    # Either NCCL is missing, or (CPU-only build) communicators cannot exist, or there is no
    # device: all three are reported, none hangs.
    with pytest.raises((pc.NcclUnavailable, pc.CudaError, ValueError)):
        c.allreduce(xs, algo="nccl", inplace=True)


def test_process_group_refuses_host_tensors_for_nccl_and_device_tensors_for_others():
    group = pc.ProcessGroup.__new__(pc.ProcessGroup)
    group._where, group.size, group.rank = "rank 0", 2, 0
    with pytest.raises(TypeError, match="expected a device tensor"):
        group._run_nccl(
            "allreduce", np.ones(4, np.float32), pc.ReduceOp.SUM, "nccl", 0, False, None, False
        )
    with pytest.raises(TypeError, match="NCCL"):
        group._run_nccl(
            "allreduce",
            FakeDeviceTensor(np.ones(4, np.float32)),
            pc.ReduceOp.SUM,
            "ring",
            0,
            False,
            None,
            False,
        )


def test_process_group_nccl_ids_travel_through_the_store(monkeypatch):
    """Group rank 0 publishes the unique id, the others read it under the same key, whatever
    device each rank uses; a communicator is made once per (group, device)."""
    from types import SimpleNamespace

    store: dict[str, bytes] = {}
    made: list[tuple] = []

    class Client:
        def set(self, key: str, value: bytes) -> None:
            store[key] = value

        def get(self, key: str, timeout: float | None = None) -> bytes:
            return store[key]

    monkeypatch.setattr(pc.nccl, "get_unique_id", lambda: bytes(range(128)))
    monkeypatch.setattr(
        pc.nccl,
        "NcclCommunicator",
        lambda n, uid, rank, device, timeout: made.append((n, uid, rank, device)) or object(),
    )
    worlds = [SimpleNamespace(client=Client(), timeout=5.0) for _ in range(2)]
    groups = [
        SimpleNamespace(_world=w, group_id=3, members=[0, 2], rank=r, size=2)
        for r, w in enumerate(worlds)
    ]
    c0 = pc.nccl.group_communicator(groups[0], device=0)
    c1 = pc.nccl.group_communicator(groups[1], device=1)
    assert made == [(2, bytes(range(128)), 0, 0), (2, bytes(range(128)), 1, 1)]
    assert list(store) == ["pycollective/nccl/3/0-2/1"]
    assert pc.nccl.group_communicator(groups[0], device=0) is c0
    assert pc.nccl.group_communicator(groups[1], device=1) is c1
    assert len(made) == 2
