"""The torch.distributed backend "pycollective": every collective and dtype against gloo's
result in the same processes (2, 3 and 4 ranks), DDP against gloo, and the error cases. Each
world size is one spawned job under a hard deadline that runs many checks."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip(
    "torch", reason="the torch backend needs torch (pip install pycollective[torch])"
)

from multiproc import run_ranks  # noqa: E402

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]


def _init(rank, n, timeout=30.0, **kwargs):
    """The default group on "pycollective" (torch's TCPStore on the harness's free port) and
    a gloo group over the same ranks, to compare with."""
    import datetime

    import torch.distributed as dist

    import pycollective.torch  # noqa: F401  (registers the backend)

    port = os.environ["PYCOLLECTIVE_MASTER_PORT"]
    dist.init_process_group(
        "pycollective",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=timeout),
        **kwargs,
    )
    return dist.new_group(backend="gloo")


def _values(dtype, shape, seed):
    """Small integers in the tensor's dtype: every sum, product, min and max over <= 4 ranks is
    exact in every dtype, so pycollective and gloo must agree bitwise whatever their order."""
    g = torch.Generator().manual_seed(seed)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=g).to(dtype)


def _same(mine, theirs, what):
    if mine is None or theirs is None:  # gather's non-roots
        assert mine is None and theirs is None, what
        return
    if isinstance(mine, (list, tuple)):
        assert len(mine) == len(theirs), what
        for i, (a, b) in enumerate(zip(mine, theirs)):
            _same(a, b, f"{what}[{i}]")
        return
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, (what, mine, theirs)
    assert torch.equal(mine, theirs), f"{what}: pycollective {mine} != gloo {theirs}"


def _check_dtype(rank, n, gloo, name, seed):
    """Every collective in one dtype, through pycollective (the default group) and gloo."""
    import torch.distributed as dist

    dtype = getattr(torch, name)
    checks = 0

    def both(label, make, call, compare=True):
        """make() -> fresh arguments; call(args, group) runs the collective. The two results
        must match bitwise (where `compare`: reduce leaves non-roots' tensors unspecified)."""
        nonlocal checks
        mine, theirs = make(), make()
        call(mine, None)
        call(theirs, gloo)
        if compare:
            _same(mine, theirs, f"rank {rank} {name} {label}")
            checks += 1

    for count in (1, 7, 1000):
        x = _values(dtype, (count,), seed + 100 * rank + count)
        ops = {
            "SUM": dist.ReduceOp.SUM,
            "PRODUCT": dist.ReduceOp.PRODUCT,
            "MIN": dist.ReduceOp.MIN,
            "MAX": dist.ReduceOp.MAX,
        }
        for label, op in ops.items():
            both(
                f"all_reduce {label} {count}",
                lambda: x.clone(),
                lambda t, g, op=op: dist.all_reduce(t, op=op, group=g),
            )
        for root in range(n):
            both(
                f"broadcast root {root}",
                lambda: x.clone(),
                lambda t, g, root=root: dist.broadcast(t, root, group=g),
            )
            both(
                f"reduce root {root}",
                lambda: x.clone(),
                lambda t, g, root=root: dist.reduce(t, root, group=g),
                rank == root,
            )
        both(
            "all_gather",
            lambda: [torch.zeros_like(x) for _ in range(n)],
            lambda outs, g: dist.all_gather(outs, x, group=g),
        )
        both(
            "all_gather_into_tensor",
            lambda: torch.zeros(n * count, dtype=dtype),
            lambda out, g: dist.all_gather_into_tensor(out, x, group=g),
        )
        chunks = [_values(dtype, (count,), seed + 7 * rank + p) for p in range(n)]
        both(
            "reduce_scatter",
            lambda: torch.zeros_like(x),
            lambda out, g: dist.reduce_scatter(out, chunks, group=g),
        )
        both(
            "reduce_scatter_tensor",
            lambda: torch.zeros_like(x),
            lambda out, g: dist.reduce_scatter_tensor(out, torch.cat(chunks), group=g),
        )
        both(
            "all_to_all",
            lambda: [torch.zeros_like(x) for _ in range(n)],
            lambda outs, g: dist.all_to_all(outs, chunks, group=g),
        )
        both(
            "all_to_all_single",
            lambda: torch.zeros(n * count, dtype=dtype),
            lambda out, g: dist.all_to_all_single(out, torch.cat(chunks), group=g),
        )
        # Uneven splits: rank r sends (r + p) % 3 + 1 rows of 2 to rank p.
        sends = [(rank + p) % 3 + 1 for p in range(n)]
        recvs = [(p + rank) % 3 + 1 for p in range(n)]
        rows = _values(dtype, (sum(sends), 2), seed + rank)
        both(
            "all_to_all_single uneven",
            lambda: torch.zeros(sum(recvs), 2, dtype=dtype),
            lambda out, g: dist.all_to_all_single(out, rows, recvs, sends, group=g),
        )
        for root in (0, n - 1):
            both(
                f"gather root {root}",
                lambda: [torch.zeros_like(x) for _ in range(n)] if rank == root else None,
                lambda outs, g, root=root: dist.gather(x, outs, root, group=g),
            )
            both(
                f"scatter root {root}",
                lambda: torch.zeros_like(x),
                lambda out, g, root=root: dist.scatter(
                    out, chunks if rank == root else None, root, group=g
                ),
            )
    if dtype.is_floating_point:
        # AVG (gloo has none: compare with its SUM / n) and PREMUL_SUM (gloo: SUM of x * f).
        x = torch.randn(301, generator=torch.Generator().manual_seed(seed + rank)).to(dtype)
        mine, theirs = x.clone(), x.clone()
        dist.all_reduce(mine, op=dist.ReduceOp.AVG)
        dist.all_reduce(theirs, group=gloo)
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)
        torch.testing.assert_close(mine, theirs / n, rtol=tol, atol=tol)
        mine, theirs = x.clone(), x * 0.5
        dist.all_reduce(mine, op=dist._make_nccl_premul_sum(0.5))
        dist.all_reduce(theirs, group=gloo)
        torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)
        # reduce with PREMUL_SUM: the root gets the scaled sum, the others keep their input.
        mine, theirs = x.clone(), x * 0.5
        dist.reduce(mine, 0, op=dist._make_nccl_premul_sum(0.5))
        dist.reduce(theirs, 0, group=gloo)
        torch.testing.assert_close(mine, theirs if rank == 0 else x, rtol=tol, atol=tol)
        checks += 3
    return checks


def _collectives(rank, n):
    import torch.distributed as dist

    gloo = _init(rank, n)
    assert dist.get_backend() == "pycollective"
    checks = sum(_check_dtype(rank, n, gloo, name, seed) for seed, name in enumerate(DTYPES))

    # Non-contiguous tensors (a transposed view): copied in and back out, same result.
    base = _values(torch.float32, (6, 4), rank)
    mine, theirs = base.clone().t(), base.clone().t()
    assert not mine.is_contiguous()
    dist.all_reduce(mine)
    dist.all_reduce(theirs, group=gloo)
    _same(mine, theirs, "non-contiguous all_reduce")
    outs = [torch.zeros(6, 4).t() for _ in range(n)]
    dist.all_gather(outs, base.t())
    _same(outs, [_values(torch.float32, (6, 4), p).t() for p in range(n)], "non-contiguous ag")

    # all_reduce_coalesced, and async Work: wait(timeout), is_completed, get_future.
    ts = [_values(torch.float64, (5,), rank), _values(torch.float64, (2, 3), rank + 9)]
    want = [t.clone() for t in ts]
    for t in want:
        dist.all_reduce(t, group=gloo)
    dist.all_reduce_coalesced(ts)
    _same(ts, want, "all_reduce_coalesced")
    t = _values(torch.int64, (100,), rank)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert isinstance(fut, torch.futures.Future)
    (got,) = fut.wait()
    assert work.wait(timeout=__import__("datetime").timedelta(seconds=10))
    assert work.is_completed() and got is t
    want = _values(torch.int64, (100,), rank)
    dist.all_reduce(want, group=gloo)
    _same(t, want, "async all_reduce")
    chained = (
        dist.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    )
    assert chained.wait().tolist() == [2.0 * n] * 3

    # send/recv around the ring (even ranks send first), and barrier.
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(10, dtype=torch.int32)
    if rank % 2 == 0:
        dist.send(torch.full((10,), rank, dtype=torch.int32), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(torch.full((10,), rank, dtype=torch.int32), nxt)
    assert (got == prv).all()
    # isend then irecv on every rank: point-to-point calls run in issue order per process.
    back = torch.zeros(4)
    reqs = [dist.isend(torch.arange(4.0) + rank, nxt), dist.irecv(back, prv)]
    for req in reqs:
        req.wait()
    assert back.tolist() == (torch.arange(4.0) + prv).tolist()
    ops = [
        dist.P2POp(dist.isend, torch.full((6,), 1.0 + rank), nxt),
        dist.P2POp(dist.irecv, back2 := torch.zeros(6), prv),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert (back2 == 1.0 + prv).all()
    dist.barrier()
    # barrier(async_op=True) returns at once, while the last rank is still away.
    if rank == n - 1:
        __import__("time").sleep(1.0)
    began = __import__("time").monotonic()
    pending = dist.barrier(async_op=True)
    if rank == 0:
        assert __import__("time").monotonic() - began < 0.5 and not pending.is_completed()
    assert pending.wait()

    # Sub-groups: torch's new_group over pycollective (members only call the backend).
    evens = [r for r in range(n) if r % 2 == 0]
    sub = dist.new_group(evens, backend="pycollective")
    if rank in evens:
        s = torch.tensor([float(rank)])
        dist.all_reduce(s, group=sub)
        assert s.item() == sum(evens)
        assert dist.get_rank(sub) == evens.index(rank)
    dist.barrier()
    dist.destroy_process_group()
    return checks


@pytest.mark.parametrize("n,transport", [(2, "shm"), (3, "tcp"), (4, "shm")])
def test_collectives_match_gloo(n, transport):
    """shm is what ranks on one host get; tcp (forced) is what ranks on other hosts get."""
    results = run_ranks(_collectives, n, timeout=150, env={"PYCOLLECTIVE_TRANSPORT": transport})
    assert len(set(results)) == 1 and results[0] > 100 * len(DTYPES) // 4


def test_host_array_shares_memory_or_hands_back_the_tensor():
    """The backend hands pycollective numpy views of contiguous CPU tensors (calls on small
    numpy arrays are remembered and run natively); anything numpy cannot view stays a tensor."""
    from pycollective.torch.ops import host_array

    t = torch.arange(6, dtype=torch.float32)
    a = host_array(t)
    a[0] = 42
    assert t[0] == 42
    p = torch.nn.Parameter(torch.ones(3))
    host_array(p)[1] = 7  # a parameter is viewed through detach(): same memory
    assert p[1].item() == 7
    bf = torch.zeros(4, dtype=torch.bfloat16)
    b = host_array(bf)
    if b is not bf:  # ml_dtypes present: a bfloat16 numpy view
        b[2] = 1.5
        assert str(b.dtype) == "bfloat16" and bf[2].item() == 1.5
    for keep in (
        torch.ones(3, dtype=torch.bool),
        torch.ones(3, 2).t(),
        torch._neg_view(torch.ones(3)),
    ):
        assert host_array(keep) is keep


class _DoneHandle:
    """A pycollective handle whose native call already finished (or failed)."""

    def __init__(self, error=None):
        self.error = error

    def is_completed(self):
        return True

    def wait(self, timeout=None):
        if self.error is not None:
            raise self.error


def test_coalesced_work_finishes_parts_that_are_already_done():
    """A *_coalesced call joins its parts' Works; a part whose native call finished before the
    join still has to copy its results back (non-contiguous outputs) and raise its error."""
    from pycollective.errors import CollectiveError
    from pycollective.torch.process_group import _joined
    from pycollective.torch.work import Work

    copied = []
    part = Work([_DoneHandle()], [], finish=lambda: copied.append(True))
    assert _joined([part], []).wait() and copied == [True]
    failed = Work([_DoneHandle(CollectiveError("rank 1 failed"))], [])
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        _joined([failed], []).wait()


def _model(seed):
    """An MLP with a branch that forward() skips when asked (find_unused_parameters)."""
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
            self.head = nn.Linear(64, 4)
            self.spare = nn.Linear(64, 4)

        def forward(self, x, use_spare=True):
            h = self.body(x)
            return self.head(h) + (self.spare(h) if use_spare else 0)

    torch.manual_seed(seed)
    return Net()


def _train(model, group, rank, steps, accumulate, use_spare, hook, **ddp_kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=group, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    device = next(model.parameters()).device
    for _ in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
            x, y = x.to(device), y.to(device)
            if micro < accumulate - 1:
                with ddp.no_sync():  # gradients accumulate locally, no allreduce
                    torch.nn.functional.mse_loss(ddp(x, use_spare), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x, use_spare), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp(rank, n):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    gloo = _init(rank, n)
    configs = {
        "buckets": dict(accumulate=1, use_spare=True, hook=None, bucket_cap_mb=0.01),
        "no_sync": dict(accumulate=3, use_spare=True, hook=None),
        "unused": dict(accumulate=1, use_spare=False, hook=None, find_unused_parameters=True),
        "fp16_hook": dict(accumulate=1, use_spare=True, hook=default_hooks.fp16_compress_hook),
    }
    spread = {}
    for name, cfg in configs.items():
        mine = _train(_model(7), None, rank, 6, **cfg)
        theirs = _train(_model(7), gloo, rank, 6, **cfg)
        tol = 2e-3 if cfg["hook"] is not None else 1e-5
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
        # Training moved the parameters, identically on every rank (bitwise).
        flat = torch.cat([p.reshape(-1) for p in mine])
        assert not torch.equal(flat, torch.cat([p.reshape(-1) for p in _model(7).parameters()]))
        everyone = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(everyone, flat)
        assert all(torch.equal(e, flat) for e in everyone), name
        spread[name] = max((a - b).abs().max().item() for a, b in zip(mine, theirs))
    spread["fsdp2"] = _fsdp2_spread(rank, gloo)
    dist.destroy_process_group()
    return spread


def _fsdp2(rank, mesh):
    """Three steps of an FSDP2 (fully_shard) MLP on `mesh`; the full parameters after."""
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        m(torch.randn(8, 16, generator=g)).square().mean().backward()
        opt.step()
    return [p.full_tensor().detach() for p in m.parameters()]


def _fsdp2_spread(rank, gloo):
    """FSDP2 over the default ("pycollective") mesh against a mesh on the gloo group."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mine = _fsdp2(rank, init_device_mesh("cpu", (torch.distributed.get_world_size(),)))
    theirs = _fsdp2(rank, DeviceMesh.from_group(gloo, "cpu"))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return max((a - b).abs().max().item() for a, b in zip(mine, theirs))


def test_ddp_matches_gloo():
    spreads = run_ranks(_ddp, 2, timeout=120)
    assert set(spreads[0]) == {"buckets", "no_sync", "unused", "fp16_hook", "fsdp2"}


def _cuda(rank, n):
    """CUDA tensors through the backend (NCCL underneath, on torch's current stream) against
    gloo on CPU copies of the same values; then DDP on the GPU against DDP over gloo on CPU."""
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    gloo = _init(rank, n)
    checks = 0
    for seed, name in enumerate(["float16", "bfloat16", "float32", "int64"]):
        dtype = getattr(torch, name)
        for count in (1, 1000, (1 << 20) + 3):
            x = _values(dtype, (count,), seed + rank)
            mine, theirs = x.to(dev), x.clone()
            dist.all_reduce(mine)
            dist.all_reduce(theirs, group=gloo)
            _same(mine.cpu(), theirs, f"rank {rank} {name} all_reduce {count}")
            mine, theirs = x.to(dev), x.clone()
            dist.broadcast(mine, src=n - 1)
            dist.broadcast(theirs, src=n - 1, group=gloo)
            _same(mine.cpu(), theirs, f"rank {rank} {name} broadcast {count}")
            outs = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)]
            dist.all_gather(outs, x.to(dev))
            want = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(want, x.clone(), group=gloo)
            _same([o.cpu() for o in outs], want, f"rank {rank} {name} all_gather {count}")
            flat = torch.empty(n * count, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(flat, x.to(dev))
            _same(flat.cpu(), torch.cat(want), f"rank {rank} {name} all_gather_into_tensor")
            big = _values(dtype, (n * count,), seed + 10 + rank)
            mine, theirs = (
                torch.empty(count, dtype=dtype, device=dev),
                torch.empty(count, dtype=dtype),
            )
            dist.reduce_scatter_tensor(mine, big.to(dev))
            dist.reduce_scatter_tensor(theirs, big.clone(), group=gloo)
            _same(mine.cpu(), theirs, f"rank {rank} {name} reduce_scatter_tensor {count}")
            checks += 5
    # AVG, on a side stream whose queued work the collective must wait for; async Work.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.full((1 << 22,), 1.0 + rank, device=dev) * 2  # queued on `side`
        work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
        work.wait()
        got = t.cpu()
    assert (got == sum(2.0 * (1 + r) for r in range(n)) / n).all(), got[:4]
    r = torch.full((1000,), float(rank + 1), device=dev)
    dist.reduce(r, dst=0, op=dist.ReduceOp.MAX)
    if rank == 0:
        assert (r.cpu() == float(n)).all()
    # DDP on the GPU against DDP over gloo on the CPU, same data: the same parameters after
    # six steps up to the two devices' float arithmetic.
    cfg = dict(accumulate=1, use_spare=True, hook=None, bucket_cap_mb=0.01)
    mine = _train(_model(7).to(dev), None, rank, 6, **cfg)
    theirs = _train(_model(7), gloo, rank, 6, **cfg)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    dist.destroy_process_group()
    return checks + 2


@pytest.mark.gpu
@pytest.mark.nccl
def test_cuda_tensors_match_gloo():
    """One rank per GPU (NCCL refuses two ranks on one device): a single GPU runs one rank."""
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA and a CUDA device")
    import pycollective as pc

    if not pc.build_info()["cuda"]:
        pytest.skip("this build of pycollective has no CUDA")
    n = min(2, torch.cuda.device_count())
    assert run_ranks(_cuda, n, timeout=240) == [4 * 3 * 5 + 2] * n


def _abort(rank, n):
    """Rank 0 aborts the group while rank 1 is still busy: it must not wait for rank 1 to leave;
    rank 1's next call fails, and destroy_process_group then returns at once."""
    import time

    import torch.distributed as dist

    _init(rank, n, timeout=30)
    t = torch.ones(4)
    dist.all_reduce(t)
    began = time.monotonic()
    if rank == 0:
        dist.distributed_c10d._abort_process_group()
        return ["aborted", time.monotonic() - began]
    time.sleep(2.0)
    try:
        dist.all_reduce(t)
        outcome = "no error"
    except RuntimeError:
        outcome = "failed"
    began = time.monotonic()
    dist.destroy_process_group()
    return [outcome, time.monotonic() - began]


@pytest.mark.timeout(90)
def test_abort_does_not_wait_for_the_others():
    (first, aborting), (second, leaving) = run_ranks(_abort, 2, timeout=60)
    assert (first, second) == ("aborted", "failed")
    assert aborting < 1.5 and leaving < 1.5, (aborting, leaving)


def _dead_peer(rank, n):
    """Rank n-1 dies between two all_reduces; the others must fail fast, naming it."""
    import time

    import torch.distributed as dist

    _init(rank, n, timeout=60)
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == n - 1:
        os._exit(3)
    start = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(t)
            time.sleep(0.05)
    except RuntimeError as exc:
        return [type(exc).__name__, str(exc), time.monotonic() - start]
    return ["no error", "", 0.0]


def test_dead_peer_fails_every_survivor_fast():
    n = 3
    results = run_ranks(_dead_peer, n, timeout=90, expect_exit={n - 1: 3})
    for kind, msg, seconds in results[:-1]:
        assert kind == "DistBackendError", (kind, msg)
        assert f"rank {n - 1}" in msg, msg
        assert seconds < 15, (seconds, msg)  # the torch timeout is 60 s


def _errors(rank, n):
    import datetime
    import glob
    import time

    import torch.distributed as dist

    import pycollective as pc

    out = {}
    shm_before = set(glob.glob("/dev/shm/*"))
    _init(rank, n, timeout=2)
    # Arguments refused before anything moves, on the calling rank.
    for label, call in {
        "dtype": lambda: dist.all_reduce(torch.zeros(3, dtype=torch.bool)),
        "op": lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=dist.ReduceOp.BAND),
    }.items():
        try:
            call()
            out[label] = "no error"
        except (TypeError, ValueError) as exc:
            out[label] = str(exc)
    # A call that times out: rank 1 is late to the all_reduce. init's timeout (2 s)
    # is the collective's deadline; Work.wait(timeout=) is a shorter one.
    t = torch.ones(10)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
            out["wait"] = "no error"
        except RuntimeError as exc:
            out["wait"] = str(exc)
        start = time.monotonic()
        try:
            work.wait()
            out["timeout"] = "no error"
        except RuntimeError as exc:
            out["timeout"] = str(exc)
        out["timeout_s"] = time.monotonic() - start
    else:
        time.sleep(3.5)
        try:
            dist.all_reduce(t)
        except RuntimeError as exc:
            out["late"] = str(exc)
    before_destroy = time.monotonic()
    dist.destroy_process_group()
    out["destroy1_s"] = time.monotonic() - before_destroy
    out["released"] = not pc.is_initialized()
    # The same process forms a new group (a new generation of keys in a fresh store), and a
    # mismatched call fails on both ranks, naming the other.
    os.environ["PYCOLLECTIVE_MASTER_PORT"] = os.environ["SECOND_PORT"]
    _init(rank, n, timeout=20)
    assert dist.all_reduce(torch.ones(3), async_op=True).get_future().wait()[0].sum() == 3 * n
    try:
        dist.all_reduce(torch.ones(10 + rank))
        out["mismatch"] = "no error"
    except RuntimeError as exc:
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    before_destroy = time.monotonic()
    dist.destroy_process_group()
    out["destroy_s"] = time.monotonic() - before_destroy
    time.sleep(0.5)
    import threading

    out["threads_left"] = [t.name for t in threading.enumerate() if "pycollective" in t.name]
    out["shm_left"] = sorted(set(glob.glob("/dev/shm/*pyc*")) - shm_before)
    return out


def test_errors():
    from multiproc import reserve_ports

    with reserve_ports(1) as reserved:  # the second group's store, held while the ranks run
        r0, r1 = run_ranks(_errors, 2, timeout=90, env={"SECOND_PORT": str(reserved.ports[0])})
    for r in (r0, r1):
        assert "bool" in r["dtype"] and "rank" in r["dtype"], r["dtype"]
        assert "BAND" in r["op"] or "not supported" in r["op"], r["op"]
        assert r["released"] and not r["shm_left"] and not r["threads_left"], r
        assert "DistBackendError" in r["mismatch"] and "element count" in r["mismatch"], r
    assert "still running" in r0["wait"], r0
    assert "timed out after 2 s" in r0["timeout"] and r0["timeout_s"] < 4, r0
    assert "rank" in r1["late"], r1
