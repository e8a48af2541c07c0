"""GPU benchmark: run by bench/gpu_check.sh on a machine with an NVIDIA GPU (python
bench/gpu_bench.py --out results.json). Every part puts its peer in the same run, so the ratios,
not the absolute numbers, carry the result.

1. kernels: the reduction kernel dst = a + b on 1 GiB buffers (float32, bfloat16, float16)
   against a device-to-device copy of the same buffer. Traffic counts every byte read and
   written (reduce: 3 x size, copy: 2 x size); a memory-bound kernel should move bytes about as
   fast as the copy (ratio near 1). CuPy's own elementwise add is the peer where installed.
2. replicas: 4 replicas on one GPU, LocalCommunicator over device buffers (ring and direct),
   algbw and busbw (nccl-tests: busbw = algbw x 2(n-1)/n), each result checked.
3. nccl: single-rank all-reduce through pycollective's NCCL binding against CuPy's NCCL binding,
   same sizes, same stream: host time per call (enqueue) and device time per call.
4. torch: torch.distributed, one rank on the GPU, ``dist.all_reduce`` of a CUDA tensor through
   the "pycollective" backend against torch's own "nccl" backend in the same process (both end
   in NCCL; the difference is what each backend does around it): host and device time per call.

Needs a CUDA build of pycollective; CuPy and NCCL are optional (their parts are skipped with the
reason). Device memory comes from pycollective.device.DeviceArray, so parts 1 and 2 run
without CuPy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pycollective as pc
from pycollective._ext import _C
from pycollective.device import DeviceArray

GiB = 1 << 30
MiB = 1 << 20
CODES = {"float16": 0, "bfloat16": 1, "float32": 2}


def _sync_default_stream() -> None:
    _C.cuda_synchronize(stream=0)


def _device_seconds(
    fn: Callable[[], None],
    iters: int,
    warmup: int = 2,
    reps: int = 3,
    sync: Callable[[], None] = _sync_default_stream,
) -> float:
    """Median over `reps` of (time of `iters` enqueued calls, synchronized) / iters."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t) / iters)
    return statistics.median(samples)


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


# ---- 1. kernels vs copy ----


def bench_kernels(nbytes: int, iters: int) -> list[dict]:
    rows = []
    copy_gbs = _copy_row(rows, nbytes, iters)
    for name, code in CODES.items():
        _kernel_rows(rows, name, code, nbytes, iters, copy_gbs)  # buffers freed on return
    return rows


def _copy_row(rows: list[dict], nbytes: int, iters: int) -> float:
    src, dst = DeviceArray(nbytes, np.uint8), DeviceArray(nbytes, np.uint8)
    t = _device_seconds(lambda: _C.cuda_copy(dst=dst.ptr, src=src.ptr, bytes=nbytes), iters)
    gbs = 2 * nbytes / t / 1e9
    rows.append(
        {
            "what": "device-to-device copy",
            "dtype": "-",
            "bytes": nbytes,
            "ms": t * 1e3,
            "traffic_GBps": gbs,
            "vs_copy": 1.0,
        }
    )
    return gbs


def _kernel_rows(
    rows: list[dict], name: str, code: int, nbytes: int, iters: int, copy_gbs: float
) -> None:
    dtype = _bf16() if name == "bfloat16" else np.dtype(name)
    count = nbytes // np.dtype(dtype).itemsize
    a, b, d = (DeviceArray(count, dtype) for _ in range(3))
    # Values: ones (the kernel's speed does not depend on them); the result is checked below.
    ones = np.ones(1 << 20, dtype)
    for arr in (a, b):
        for off in range(0, nbytes, ones.nbytes):
            _C.cuda_copy(
                dst=arr.ptr + off, src=ones.ctypes.data, bytes=min(ones.nbytes, nbytes - off)
            )
    t = _device_seconds(
        lambda: _C.cuda_reduce(dst=d.ptr, a=a.ptr, b=b.ptr, count=count, dtype=code, op=0), iters
    )
    probe = np.empty(4, dtype)
    _C.cuda_copy(dst=probe.ctypes.data, src=d.ptr + nbytes - probe.nbytes, bytes=probe.nbytes)
    _C.cuda_synchronize(stream=0)
    assert np.all(probe.astype(np.float32) == 2), f"{name} sum kernel gave {probe}"
    gbs = 3 * nbytes / t / 1e9
    rows.append(
        {
            "what": "pycollective reduce (sum)",
            "dtype": name,
            "bytes": nbytes,
            "ms": t * 1e3,
            "traffic_GBps": gbs,
            "vs_copy": gbs / copy_gbs,
        }
    )
    if name == "float32":
        rows.extend(_cupy_add_row(a, b, d, count, iters, copy_gbs))


def _cupy_add_row(
    a: DeviceArray, b: DeviceArray, d: DeviceArray, count: int, iters: int, copy_gbs: float
) -> list[dict]:
    try:
        import cupy
    except ImportError:
        return [{"what": "cupy.add (peer)", "skipped": "CuPy not installed"}]

    def view(x: DeviceArray) -> Any:
        memory = cupy.cuda.UnownedMemory(x.ptr, x.nbytes, x)
        return cupy.ndarray((count,), cupy.float32, cupy.cuda.MemoryPointer(memory, 0))

    ca, cb, cd = view(a), view(b), view(d)
    with cupy.cuda.Stream.null:
        t = _device_seconds(lambda: cupy.add(ca, cb, out=cd), iters)
    gbs = 3 * a.nbytes / t / 1e9
    return [
        {
            "what": "cupy.add (peer)",
            "dtype": "float32",
            "bytes": a.nbytes,
            "ms": t * 1e3,
            "traffic_GBps": gbs,
            "vs_copy": gbs / copy_gbs,
        }
    ]


# ---- 2. replicas on one GPU ----


def bench_replicas(n: int, sizes: list[int], algos: list[str]) -> list[dict]:
    rows = []
    comm = pc.LocalCommunicator(n, timeout=120)
    for nbytes in sizes:
        count = nbytes // 4
        xs = [DeviceArray.from_host(np.full(count, r + 1, np.float32)) for r in range(n)]
        outs = [DeviceArray(count, np.float32) for _ in range(n)]
        want = n * (n + 1) / 2
        for algo in algos:
            comm.allreduce(xs, algo=algo, out=outs)  # warm-up and correctness
            got = [o.get()[[0, -1]] for o in outs]
            ok = all(float(v) == want for g in got for v in g)
            iters = max(2, min(50, int(2 * GiB // max(nbytes, 1))))
            samples = []
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(iters):
                    comm.allreduce(xs, algo=algo, out=outs)
                samples.append((time.perf_counter() - t) / iters)
            sec = statistics.median(samples)
            algbw = nbytes / sec / 1e9
            rows.append(
                {
                    "algo": algo,
                    "replicas": n,
                    "bytes": nbytes,
                    "ms": sec * 1e3,
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * 2 * (n - 1) / n,
                    "correct": ok,
                }
            )
        del xs, outs
    return rows


# ---- 3. NCCL: our binding vs CuPy's ----


def bench_nccl(sizes: list[int]) -> dict:
    out: dict[str, Any] = {"rows": []}
    try:
        info = pc.nccl.library_info()
    except pc.NcclUnavailable as e:
        return {"skipped": f"NCCL not available to pycollective: {e}"}
    out["pycollective_nccl"] = info
    t = time.perf_counter()
    ours = pc.nccl.NcclCommunicator(1, pc.nccl.get_unique_id(), 0, device=0, timeout=120)
    out["pycollective_init_s"] = time.perf_counter() - t
    theirs = None
    try:
        from cupy.cuda import nccl as cnccl

        t = time.perf_counter()
        theirs = cnccl.NcclCommunicator(1, cnccl.get_unique_id(), 0)
        out["cupy_init_s"] = time.perf_counter() - t
        out["cupy_nccl_version"] = cnccl.get_version()
    except Exception as e:  # noqa: BLE001 - any failure only skips the peer
        out["cupy_skipped"] = f"CuPy's NCCL binding unavailable: {type(e).__name__}: {e}"
    for nbytes in sizes:
        out["rows"].append(_nccl_row(ours, theirs, nbytes))
    return out


def _nccl_row(ours: Any, theirs: Any, nbytes: int) -> dict:
    count = nbytes // 4
    send = DeviceArray.from_host(np.ones(count, np.float32))
    recv = DeviceArray(count, np.float32)
    iters = max(5, min(1000, int(GiB // 4 // max(nbytes, 1))))
    row: dict[str, Any] = {"bytes": nbytes, "iters": iters}

    def ours_call() -> None:
        ours.allreduce_ptr(send.ptr, recv.ptr, count, "float32", "sum", 0)

    row["pycollective_host_us"] = _host_us(ours_call, iters)
    row["pycollective_device_us"] = _device_seconds(ours_call, iters) * 1e6
    ours.synchronize(timeout=120)
    row["pycollective_correct"] = bool(recv.get()[-1] == 1)
    if theirs is not None:
        from cupy.cuda import nccl as cnccl

        def cupy_call() -> None:
            theirs.allReduce(send.ptr, recv.ptr, count, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM, 0)

        row["cupy_host_us"] = _host_us(cupy_call, iters)
        row["cupy_device_us"] = _device_seconds(cupy_call, iters) * 1e6
        row["host_ratio"] = row["pycollective_host_us"] / row["cupy_host_us"]
        row["device_ratio"] = row["pycollective_device_us"] / row["cupy_device_us"]
    return row


def _host_us(
    fn: Callable[[], None], iters: int, sync: Callable[[], None] = _sync_default_stream
) -> float:
    """Host time of one enqueue (the device may lag; it is synchronized after the loop)."""
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t) / iters
    sync()
    return host * 1e6


# ---- 4. torch.distributed: the "pycollective" backend vs torch's "nccl" ----


def bench_torch(sizes: list[int]) -> dict:
    try:
        import torch
        import torch.distributed as dist

        import pycollective.torch  # noqa: F401  (registers the backend)
    except ImportError as e:
        return {"skipped": f"needs PyTorch: {e}"}
    if not torch.cuda.is_available():
        return {"skipped": "this PyTorch has no CUDA"}
    import socket

    with socket.socket() as s:  # a free port for the one-rank store (released just before use)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group(
        "pycollective", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        groups = {"pycollective": None, "nccl": dist.new_group(backend="nccl")}
        out: dict[str, Any] = {"torch": torch.__version__, "rows": []}
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, device="cuda")
            iters = max(5, min(1000, int(GiB // 4 // max(nbytes, 1))))
            row: dict[str, Any] = {"bytes": nbytes, "iters": iters}
            for name, group in groups.items():

                def call(group=group, x=x) -> None:
                    dist.all_reduce(x, group=group)

                # torch's "nccl" runs on streams of its own: wait for the whole device.
                sync = torch.cuda.synchronize
                row[f"{name}_host_us"] = _host_us(call, iters, sync)
                row[f"{name}_device_us"] = _device_seconds(call, iters, sync=sync) * 1e6
            torch.cuda.synchronize()
            row["correct"] = bool((x[[0, -1]] == 1).all().item())  # one rank: the sum is x
            row["host_ratio"] = row["pycollective_host_us"] / row["nccl_host_us"]
            row["device_ratio"] = row["pycollective_device_us"] / row["nccl_device_us"]
            out["rows"].append(row)
            del x
        return out
    finally:
        dist.destroy_process_group()


# ---- report ----


def _table(rows: list[dict], cols: list[str]) -> str:
    rows = [r for r in rows if "skipped" not in r]
    if not rows:
        return "  (none)"

    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    width = {c: max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  " + "  ".join(c.rjust(width[c]) for c in cols)]
    lines += ["  " + "  ".join(fmt(r.get(c, "")).rjust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_bench.json")
    p.add_argument("--bytes", type=int, default=GiB, help="kernel buffer size (default 1 GiB)")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = p.parse_args(argv)
    if not pc.build_info()["cuda"] or _C.cuda_device_count() == 0:
        print("no CUDA build or no CUDA device:", pc.build_info()["cuda"], _C.cuda_describe())
        return 2
    nbytes = 16 * MiB if args.quick else args.bytes
    replica_sizes = [MiB, 16 * MiB] if args.quick else [MiB, 16 * MiB, 256 * MiB]
    nccl_sizes = [4096, MiB] if args.quick else [4096, 64 * 1024, MiB, 64 * MiB, GiB]
    result: dict[str, Any] = {
        "build": pc.build_info(),
        "device": _C.cuda_describe(),
        "env": {
            k: v for k, v in os.environ.items() if k.startswith(("PYCOLLECTIVE_", "NCCL_", "CUDA_"))
        },
    }
    try:
        result["gpu"] = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,clocks.max.memory",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except OSError:
        result["gpu"] = "nvidia-smi not found"
    print(f"{result['gpu']} | {result['device']}")

    t = time.perf_counter()
    result["kernels"] = bench_kernels(nbytes, iters=20 if not args.quick else 5)
    print(
        f"\n1. reduction kernel vs device-to-device copy, {nbytes / GiB:.2f} GiB buffers "
        f"({time.perf_counter() - t:.1f} s)"
    )
    print(_table(result["kernels"], ["what", "dtype", "ms", "traffic_GBps", "vs_copy"]))

    t = time.perf_counter()
    result["replicas"] = bench_replicas(4, replica_sizes, ["ring", "direct"])
    print(
        f"\n2. 4 replicas on one GPU, allreduce over device buffers "
        f"({time.perf_counter() - t:.1f} s)"
    )
    print(
        _table(result["replicas"], ["algo", "bytes", "ms", "algbw_GBps", "busbw_GBps", "correct"])
    )

    t = time.perf_counter()
    result["nccl"] = bench_nccl(nccl_sizes)
    print(
        f"\n3. NCCL single-rank allreduce, pycollective binding vs CuPy's "
        f"({time.perf_counter() - t:.1f} s)"
    )
    if "skipped" in result["nccl"]:
        print("  skipped:", result["nccl"]["skipped"])
    else:
        if "cupy_skipped" in result["nccl"]:
            print("  peer skipped:", result["nccl"]["cupy_skipped"])
        print(
            _table(
                result["nccl"]["rows"],
                [
                    "bytes",
                    "pycollective_host_us",
                    "cupy_host_us",
                    "host_ratio",
                    "pycollective_device_us",
                    "cupy_device_us",
                    "device_ratio",
                    "pycollective_correct",
                ],
            )
        )

    t = time.perf_counter()
    try:
        result["torch"] = bench_torch(nccl_sizes)
    except Exception as e:  # noqa: BLE001 - reported, and the parts above are kept
        result["torch"] = {"failed": f"{type(e).__name__}: {e}"}
    print(
        f"\n4. torch.distributed all_reduce on one GPU, backend pycollective vs nccl "
        f"({time.perf_counter() - t:.1f} s)"
    )
    if "rows" not in result["torch"]:
        print("  ", result["torch"])
    else:
        print(
            _table(
                result["torch"]["rows"],
                [
                    "bytes",
                    "pycollective_host_us",
                    "nccl_host_us",
                    "host_ratio",
                    "pycollective_device_us",
                    "nccl_device_us",
                    "device_ratio",
                    "correct",
                ],
            )
        )

    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"\nwrote {args.out}")
    bad = [r for r in result["replicas"] if not r["correct"]]
    bad += [r for r in result["nccl"].get("rows", []) if not r.get("pycollective_correct", True)]
    bad += [r for r in result["torch"].get("rows", []) if not r["correct"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
