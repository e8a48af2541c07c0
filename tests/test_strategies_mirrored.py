"""MirroredStrategy: construction, contexts, run, reductions, replica-context collectives,
merge_call, failures that must not hang, distributed input, the extended API."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pycollective as pc
from pycollective import strategies as ds

ReduceOp = ds.ReduceOp


def cpus(n: int) -> list[str]:
    return [f"/cpu:{i}" for i in range(n)]


@pytest.fixture(params=[1, 2, 3, 4], ids=lambda n: f"{n}rep")
def strategy(request):
    return ds.MirroredStrategy(cpus(request.param))


# Construction ------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_devices_are_canonical_cpu_replicas():
    s = ds.MirroredStrategy(
        ["/cpu:0", "/device:CPU:1", "/job:localhost/replica:0/task:0/device:CPU:2"]
    )
    assert s.num_replicas_in_sync == 3
    assert s.extended.worker_devices == tuple(
        f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)
    )
    assert s.extended.parameter_devices == s.extended.worker_devices


@pytest.mark.timeout(20)
def test_gpu_devices_are_refused_with_a_clear_error():
    with pytest.raises(NotImplementedError, match="host memory .* no GPU replicas"):
        ds.MirroredStrategy(["/gpu:0", "/gpu:1"])


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "devices, match",
    [
        ([], "at least one"),
        (["/cpu:0", "/cpu:0"], "more than once"),
        (["/tpu:0"], "unsupported device type"),
        (["cpu zero"], "cannot parse device"),
    ],
)
def test_bad_devices(devices, match):
    with pytest.raises(ValueError, match=match):
        ds.MirroredStrategy(devices)


@pytest.mark.timeout(20)
def test_default_replicas_from_environment(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_CPU_REPLICAS", "3")
    assert ds.MirroredStrategy().num_replicas_in_sync == 3
    monkeypatch.setenv("PYCOLLECTIVE_CPU_REPLICAS", "three")
    with pytest.raises(ValueError, match="PYCOLLECTIVE_CPU_REPLICAS"):
        ds.MirroredStrategy()


@pytest.mark.timeout(20)
def test_cross_device_ops_name_algorithms():
    cases = [
        (ds.HierarchicalCopyAllReduce(), "hierarchical"),
        (ds.ReductionToOneDevice(), "reduce_to_one"),
        (ds.AlgorithmAllReduce("halving_doubling"), "halving_doubling"),
        (ds.NcclAllReduce(num_packs=2), "ring"),
        (None, "auto"),
    ]
    for ops, algo in cases:
        s = ds.MirroredStrategy(cpus(2), cross_device_ops=ops)
        assert s.extended.backend.algorithm == algo
        out = s.run(
            lambda: ds.get_replica_context().all_reduce("sum", np.arange(5, dtype=np.float32))
        )
        for r in s.experimental_local_results(out):
            np.testing.assert_array_equal(r, 2 * np.arange(5, dtype=np.float32))
    with pytest.raises(ValueError, match="unknown algorithm 'bogus'; choose one of"):
        ds.AlgorithmAllReduce("bogus")
    with pytest.raises(TypeError, match="CrossDeviceOps"):
        ds.MirroredStrategy(cpus(2), cross_device_ops="ring")
    with pytest.raises(ValueError, match="accumulation_fn"):
        ds.ReductionToOneDevice(accumulation_fn=sum)
    assert "falls back" in ds.NcclAllReduce.__doc__


@pytest.mark.timeout(20)
def test_nccl_fallback_is_logged_once(caplog):
    from pycollective.strategies import cross_device_ops as cdo

    cdo._logged_once.discard("nccl-cpu")
    with caplog.at_level("WARNING", logger="pycollective.strategies"):
        ds.NcclAllReduce()
        ds.NcclAllReduce()
    hits = [r for r in caplog.records if "no NCCL" in r.getMessage()]
    assert len(hits) == 1


@pytest.mark.timeout(20)
def test_cross_device_ops_standalone():
    ops = ds.AlgorithmAllReduce("ring")
    pr = ds.PerReplica([np.ones(3, np.float32), 2 * np.ones(3, np.float32)])
    out = ops.reduce(ReduceOp.MEAN, pr, destinations=None)
    assert isinstance(out, ds.Mirrored)
    for v in out.values:
        np.testing.assert_allclose(v, 1.5)
    b = ops.batch_reduce("SUM", [(pr, None), (pr, None)])
    assert len(b) == 2 and np.allclose(b[1].values[0], 3)
    bc = ops.broadcast(np.arange(3.0), destinations=["/cpu:0", "/cpu:1"])
    assert len(bc.values) == 2 and np.array_equal(bc.values[1], np.arange(3.0))


# Contexts -------------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_contexts_outside_inside_scope_and_run():
    default = ds.get_strategy()
    assert not ds.has_strategy()
    ctx = ds.get_replica_context()
    assert ctx is not None and ctx.replica_id_in_sync_group == 0 and ctx.num_replicas_in_sync == 1
    assert not ds.in_cross_replica_context()
    s = ds.MirroredStrategy(cpus(3))
    with s.scope() as entered:
        assert entered is s and ds.get_strategy() is s and ds.has_strategy()
        assert ds.get_replica_context() is None and ds.in_cross_replica_context()

        def fn():
            ctx = ds.get_replica_context()
            assert ds.get_strategy() is s and not ds.in_cross_replica_context()
            assert ctx.strategy is s and ctx.num_replicas_in_sync == 3
            assert ctx.devices == (s.extended.worker_devices[ctx.replica_id_in_sync_group],)
            return ctx.replica_id_in_sync_group

        ids = s.run(fn)
    assert s.experimental_local_results(ids) == (0, 1, 2)
    assert ds.get_strategy() is default
    other = ds.MirroredStrategy(cpus(2))
    with s.scope():
        with pytest.raises(RuntimeError, match="Mixing different Strategy"), other.scope():
            pass
        with pytest.raises(RuntimeError, match="inside the scope of"):
            other.run(lambda: None)


@pytest.mark.timeout(20)
def test_default_replica_context_collectives():
    ctx = ds.get_replica_context()
    x = np.arange(4.0)
    np.testing.assert_array_equal(ctx.all_reduce("sum", x), x)
    np.testing.assert_array_equal(ctx.all_gather(x, axis=0), x)
    got = ctx.merge_call(lambda strategy, v: (strategy, v * 2), args=(x,))
    assert got[0] is ds.get_strategy()
    np.testing.assert_array_equal(got[1], 2 * x)


@pytest.mark.timeout(20)
def test_experimental_set_strategy():
    s = ds.MirroredStrategy(cpus(2))
    ds.experimental_set_strategy(s)
    try:
        assert ds.get_strategy() is s and ds.in_cross_replica_context()
    finally:
        ds.experimental_set_strategy(None)
    assert not ds.has_strategy()


# run ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_run_replicas_are_concurrent_threads():
    n = 4
    s = ds.MirroredStrategy(cpus(n))
    barrier = threading.Barrier(n, timeout=10)  # only passes if all replicas run at once

    def fn():
        barrier.wait()
        return threading.get_ident()

    idents = s.experimental_local_results(s.run(fn))
    assert len(set(idents)) == n


@pytest.mark.timeout(20)
def test_a_replica_thread_that_dies_is_replaced():
    s = ds.MirroredStrategy(cpus(3))

    def leaves_a_scope_open():
        if ds.get_replica_context().replica_id_in_sync_group == 1:
            s.scope().__enter__()  # popping the replica's frame then fails, outside fn

    with pytest.raises(RuntimeError):
        s.run(leaves_a_scope_open)
    ids = s.run(lambda: ds.get_replica_context().replica_id_in_sync_group)
    assert s.experimental_local_results(ids) == (0, 1, 2)


@pytest.mark.timeout(20)
def test_replica_threads_end_with_their_strategy():
    import gc
    import weakref

    def replica_threads():
        return [t for t in threading.enumerate() if t.name.startswith("pycollective-replica")]

    before = set(replica_threads())
    s = ds.MirroredStrategy(cpus(3))
    s.run(lambda x: x + 1, args=(np.ones(10),))
    mine = set(replica_threads()) - before
    assert len(mine) == 2
    gone = weakref.ref(s)
    del s
    gc.collect()
    assert gone() is None, "the replica threads keep the strategy alive"
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in mine) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in mine)


@pytest.mark.timeout(20)
def test_run_splits_per_replica_arguments(strategy):
    n = strategy.num_replicas_in_sync
    pr = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group, np.float32)
    )
    assert isinstance(pr, ds.PerReplica) and len(pr.values) == n
    shared = np.ones(2)
    out = strategy.run(
        lambda x, y, *, z: (x + 1, y is shared, z), args=(pr, shared), kwargs={"z": pr}
    )
    xs = strategy.experimental_local_results(out[0])
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x, np.full(2, i + 1))
    assert out[1] is True  # the same object on every replica comes back unwrapped
    if n > 1:
        assert isinstance(out[0], ds.PerReplica)
    for wrong in (n - 1, n + 1):  # too few fails deep inside, too many loses values: refused
        if wrong >= 1:
            bad = ds.PerReplica([np.zeros(2)] * wrong)
            with pytest.raises(ValueError, match=f"PerReplica of {wrong} values"):
                strategy.run(lambda x: x, args=(bad,))


@pytest.mark.timeout(20)
def test_run_with_one_replica_returns_plain_values():
    s = ds.MirroredStrategy(cpus(1))
    assert s.run(lambda: 7) == 7
    assert s.experimental_local_results(7) == (7,)


@pytest.mark.timeout(20)
def test_nested_run_is_refused():
    s = ds.MirroredStrategy(cpus(2))
    with pytest.raises(RuntimeError, match="nested"):
        s.run(lambda: s.run(lambda: 1))


# Cross-replica reductions ---------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_reduce_sum_mean_and_axis(strategy):
    n = strategy.num_replicas_in_sync
    # Uneven per-replica batches: replica r has r + 1 rows.
    pr = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            np.arange(2 * (ctx.replica_id_in_sync_group + 1), dtype=np.float32).reshape(-1, 2)
            + ctx.replica_id_in_sync_group
        )
    )
    rows = np.concatenate(strategy.experimental_local_results(pr))
    np.testing.assert_allclose(strategy.reduce(ReduceOp.SUM, pr, axis=0), rows.sum(0), rtol=1e-6)
    np.testing.assert_allclose(strategy.reduce(ReduceOp.MEAN, pr, axis=0), rows.mean(0), rtol=1e-6)
    same = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(3, ctx.replica_id_in_sync_group + 1.0)
    )
    total = sum(range(1, n + 1))
    np.testing.assert_allclose(strategy.reduce("SUM", same, axis=None), np.full(3, total))
    np.testing.assert_allclose(strategy.reduce("MEAN", same, axis=None), np.full(3, total / n))
    # Nests are reduced leaf by leaf (fused).
    nest = strategy.reduce("SUM", {"a": same, "b": (same, same)}, axis=None)
    np.testing.assert_allclose(nest["b"][1], np.full(3, total))


@pytest.mark.timeout(20)
def test_reduce_non_distributed_values_follow_tf():
    s = ds.MirroredStrategy(cpus(2))
    np.testing.assert_array_equal(s.reduce("MEAN", np.ones(2), axis=None), np.ones(2))
    with pytest.raises(ValueError, match="cannot be reduced with ReduceOp.SUM"):
        s.reduce("SUM", np.ones(2), axis=None)
    one = ds.MirroredStrategy(cpus(1))
    np.testing.assert_array_equal(one.reduce("SUM", np.ones(2), axis=None), np.ones(2))
    with pytest.raises(ValueError, match="ReduceOp.SUM or ReduceOp.MEAN"):
        s.reduce("max", np.ones(2), axis=None)


@pytest.mark.timeout(20)
def test_gather_concatenates_in_replica_order(strategy):
    pr = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((ctx.replica_id_in_sync_group + 1, 2), ctx.replica_id_in_sync_group)
    )
    expected = np.concatenate(strategy.experimental_local_results(pr), axis=0)
    np.testing.assert_array_equal(strategy.gather(pr, axis=0), expected)
    pr2 = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((2, 1), ctx.replica_id_in_sync_group)
    )
    np.testing.assert_array_equal(
        strategy.gather(pr2, axis=1),
        np.concatenate(strategy.experimental_local_results(pr2), axis=1),
    )


@pytest.mark.timeout(20)
def test_reduce_inside_run_is_refused():
    s = ds.MirroredStrategy(cpus(2))
    with pytest.raises(RuntimeError, match="cross-replica context"):
        s.run(lambda: s.reduce("SUM", np.ones(1), axis=None))


# Replica-context collectives ------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_all_reduce_of_a_nest_is_fused(strategy):
    n = strategy.num_replicas_in_sync
    backend = strategy.extended.backend
    before = backend.call_counts["allreduce"]

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        nest = {
            "w": np.full((2, 3), r, np.float32),
            "b": [np.full(4, r, np.float32), np.float32(r)],
        }
        return ds.get_replica_context().all_reduce(ReduceOp.SUM, nest)

    out = strategy.run(fn)
    total = n * (n - 1) / 2
    for res in strategy.experimental_local_results(out):
        np.testing.assert_array_equal(res["w"], np.full((2, 3), total))
        np.testing.assert_array_equal(res["b"][0], np.full(4, total))
        assert np.shape(res["b"][1]) == () and res["b"][1] == total
    assert backend.call_counts["allreduce"] - before == 1


@pytest.mark.timeout(20)
def test_all_reduce_mean_and_integers():
    s = ds.MirroredStrategy(cpus(4))

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        ctx = ds.get_replica_context()
        return (
            ctx.all_reduce("MEAN", np.array([r], np.float64)),
            ctx.all_reduce("MEAN", np.array([r], np.int64)),
            ctx.all_reduce("SUM", np.array([r], np.int32)),
        )

    f, i, si = s.run(fn)
    assert f.values[2][0] == 1.5 and i.values[0][0] == 1 and i.values[0].dtype == np.int64
    assert si.values[3][0] == 6 and si.values[3].dtype == np.int32


@pytest.mark.timeout(20)
def test_all_reduce_shape_mismatch_is_an_error_not_a_hang():
    s = ds.MirroredStrategy(cpus(2))

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        return ds.get_replica_context().all_reduce("SUM", np.ones(2 + r))

    with pytest.raises(ValueError, match="tensor 0: replica 1 passed float64\\[3\\]"):
        s.run(fn)


@pytest.mark.timeout(20)
def test_all_gather_ragged(strategy):
    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        return ds.get_replica_context().all_gather(
            (np.full((r + 1, 2), r), np.array([r, r])), axis=0
        )

    out = strategy.run(fn)
    n = strategy.num_replicas_in_sync
    expect = np.concatenate([np.full((r + 1, 2), r) for r in range(n)])
    for a, b in strategy.experimental_local_results(out):
        np.testing.assert_array_equal(a, expect)
        np.testing.assert_array_equal(b, np.repeat(np.arange(n), 2))


@pytest.mark.timeout(20)
def test_merge_call(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ds.Variable(np.zeros(2))
    calls = []

    def merge_fn(s, x, var, scale=1):
        assert s is strategy and ds.in_cross_replica_context()
        assert ds.get_replica_context() is None
        assert var is v  # the same object from every replica stays whole
        calls.append(threading.get_ident())
        total = s.reduce("SUM", x, axis=None) * scale
        s.extended.update(var, lambda comp, t: comp.assign(t), args=(total,))
        return total

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        return ds.get_replica_context().merge_call(
            merge_fn, args=(np.full(2, r + 1.0), v), kwargs={"scale": 2}
        )

    out = strategy.run(fn)
    assert len(calls) == 1
    expected = np.full(2, 2.0 * n * (n + 1) / 2)
    for res in strategy.experimental_local_results(out):
        np.testing.assert_array_equal(res, expected)
    for comp in v.values:
        np.testing.assert_array_equal(comp.numpy(), expected)


@pytest.mark.timeout(20)
def test_merge_call_returning_per_replica_gives_each_replica_its_part():
    s = ds.MirroredStrategy(cpus(3))

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        return ds.get_replica_context().merge_call(
            lambda strategy, x: ds.PerReplica([c * 10 for c in x.values]), args=(r,)
        )

    assert s.experimental_local_results(s.run(fn)) == (0, 10, 20)


# Failures never hang --------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_a_replica_that_raises_releases_the_others():
    s = ds.MirroredStrategy(cpus(4))

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 2:
            raise KeyError("replica two failed")
        ctx.all_reduce("SUM", np.ones(3))
        ctx.all_reduce("SUM", np.ones(3))

    t0 = time.monotonic()
    with pytest.raises(KeyError, match="replica two failed") as info:
        s.run(fn)
    assert time.monotonic() - t0 < 30  # the others were released, not left to time out (60 s)
    assert "replica 2 of 4" in "".join(getattr(info.value, "__notes__", []))
    # The strategy is usable afterwards.
    out = s.run(lambda: ds.get_replica_context().all_reduce("SUM", np.ones(1)))
    assert out.values[0][0] == 4


@pytest.mark.timeout(20)
def test_waiting_replicas_see_which_replica_failed():
    s = ds.MirroredStrategy(cpus(3))
    seen = []

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            raise RuntimeError("boom")
        try:
            ctx.all_reduce("SUM", np.ones(3))
        except ds.ReplicaFailed as exc:
            seen.append(str(exc))
            raise

    with pytest.raises(RuntimeError, match="boom"):
        s.run(fn)
    assert seen and all("replica 0 raised RuntimeError: boom" in m for m in seen)


@pytest.mark.timeout(20)
def test_a_replica_that_returns_early_fails_the_slot_at_once():
    s = ds.MirroredStrategy(cpus(3))

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            return None
        return ctx.all_reduce("SUM", np.ones(2))

    t0 = time.monotonic()
    with pytest.raises(
        ds.ReplicaFailed,
        match="replica 1 returned from its replica function without calling all_reduce",
    ):
        s.run(fn)
    assert time.monotonic() - t0 < 30  # failed at once, not at the collective timeout (60 s)


@pytest.mark.timeout(20)
def test_different_collectives_are_a_protocol_error():
    s = ds.MirroredStrategy(cpus(2))

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            return ctx.all_gather(np.ones(2), axis=0)
        return ctx.all_reduce("SUM", np.ones(2))

    with pytest.raises(
        pc.ProtocolError, match="replica 1 called all_gather.*but replica 0 called all_reduce"
    ):
        s.run(fn)


@pytest.mark.timeout(20)
def test_slow_replica_times_out_with_the_missing_replica_named(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_TIMEOUT", "0.5")
    s = ds.MirroredStrategy(cpus(2))
    release = threading.Event()

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            release.wait(5)  # stuck outside any collective
            return None
        return ctx.all_reduce("SUM", np.ones(2))

    t0 = time.monotonic()
    with pytest.raises(
        pc.CollectiveTimeout,
        match="replica 0 waited 0.5 s in all_reduce.*for replica 1, which never arrived",
    ):
        try:
            s.run(fn)
        finally:
            release.set()
    assert time.monotonic() - t0 < 30  # the 0.5 s timeout fired, not the default 60 s


@pytest.mark.timeout(30)
def test_one_calls_timeout_seconds_applies_to_that_call(monkeypatch):
    """CommunicationOptions(timeout_seconds=) given to one all_reduce bounds that call's wait
    (the strategy's timeout is 60 s here), as tf's per-call options do; the backend's
    collectives inside it take the same bound."""
    monkeypatch.setenv("PYCOLLECTIVE_TIMEOUT", "60")
    s = ds.MirroredStrategy(cpus(2))
    quick = ds.experimental.CommunicationOptions(timeout_seconds=0.5)
    release = threading.Event()
    waited = []

    def fn():
        ctx = ds.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            release.wait(3)  # stuck outside any collective
            return None
        t0 = time.monotonic()
        try:
            return ctx.all_reduce("SUM", np.ones(2), options=quick)
        finally:
            waited.append(time.monotonic() - t0)
            release.set()

    with pytest.raises(pc.CollectiveTimeout, match="replica 0 waited 0.5 s in all_reduce"):
        s.run(fn)
    assert waited and waited[0] < 2.5, waited  # the call's 0.5 s, not the strategy's 60

    # reduce_to with options, then without: the backend's collective gets each call's bound.
    s2 = ds.MirroredStrategy(cpus(2))
    backend = s2.extended.backend
    seen = []
    real = backend._call

    def spy(method, *args, **kwargs):
        seen.append(backend.call_timeout_seconds)
        return real(method, *args, **kwargs)

    backend._call = spy
    pr = s2.experimental_distribute_values_from_function(lambda ctx: np.ones(3))
    slow = ds.experimental.CommunicationOptions(timeout_seconds=2.5)
    s2.extended.reduce_to("SUM", pr, destinations=None, options=slow)
    s2.extended.reduce_to("SUM", pr, destinations=None)
    assert seen == [2.5, 60.0], seen


@pytest.mark.timeout(30)
def test_one_calls_implementation_applies_to_that_call():
    """CommunicationOptions(implementation=) given to one call runs that call's collectives
    with its algorithm (RING: the ring; NCCL: the ring too, CPU replicas have no NCCL), and
    the next call without options with the strategy's again, as tf's per-call options do."""
    s = ds.MirroredStrategy(cpus(2), cross_device_ops=ds.ReductionToOneDevice())
    backend = s.extended.backend
    seen = []
    real = backend._call

    def spy(method, *args, **kwargs):
        seen.append((method, kwargs.get("algo")))
        return real(method, *args, **kwargs)

    backend._call = spy
    ring = ds.experimental.CommunicationOptions(implementation="RING")
    nccl = ds.experimental.CommunicationOptions(implementation="NCCL")

    def fn():
        ctx = ds.get_replica_context()
        x = np.full(3, ctx.replica_id_in_sync_group + 1.0)
        return [
            ctx.all_reduce("SUM", x, options=ring),
            ctx.all_reduce("SUM", x),
            ctx.all_gather(x, axis=0, options=nccl),
        ]

    out = s.run(fn)
    for r in range(2):
        np.testing.assert_array_equal(out[0].values[r], [3.0] * 3)
        np.testing.assert_array_equal(out[1].values[r], [3.0] * 3)
        np.testing.assert_array_equal(out[2].values[r], [1.0] * 3 + [2.0] * 3)
    pr = s.experimental_distribute_values_from_function(lambda ctx: np.ones(3))
    np.testing.assert_array_equal(
        s.extended.reduce_to("SUM", pr, destinations=None, options=ring), [2.0] * 3
    )
    s.extended.batch_reduce_to("SUM", [(pr, None)])
    algos = [algo for _, algo in seen]
    assert algos == ["ring", "reduce_to_one", "ring", "ring", "reduce_to_one"], seen


@pytest.mark.timeout(20)
def test_merge_fn_error_reaches_the_caller():
    s = ds.MirroredStrategy(cpus(3))

    def merge_fn(strategy):
        raise ZeroDivisionError("in merge_fn")

    with pytest.raises(ZeroDivisionError, match="in merge_fn"):
        s.run(lambda: ds.get_replica_context().merge_call(merge_fn))


# Distributed input ----------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_distribute_dataset_splits_global_batches_evenly_and_unevenly(strategy):
    n = strategy.num_replicas_in_sync
    x = np.arange(22 * 3, dtype=np.float32).reshape(22, 3)
    y = np.arange(22)
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 22, 8)]  # 8, 8, 6 rows
    steps = list(strategy.experimental_distribute_dataset(batches))
    assert len(steps) == 3
    for (bx, by), (px, py) in zip(batches, steps):
        xs = strategy.experimental_local_results(px)
        ys = strategy.experimental_local_results(py)
        assert len(xs) == n
        np.testing.assert_array_equal(np.concatenate(xs), bx)
        np.testing.assert_array_equal(np.concatenate(ys), by)
        sizes = [len(a) for a in xs]
        assert max(sizes) - min(sizes) <= 1
    # Re-iterable: a second epoch.
    assert len(list(strategy.experimental_distribute_dataset(batches))) == 3


@pytest.mark.timeout(20)
def test_distribute_dataset_batch_smaller_than_replicas():
    s = ds.MirroredStrategy(cpus(4))
    (step,) = list(s.experimental_distribute_dataset([{"x": np.ones((2, 5))}]))
    parts = s.experimental_local_results(step["x"])
    assert [p.shape for p in parts] == [(1, 5), (1, 5), (0, 5), (0, 5)]
    # A training step still works with empty replicas.
    out = s.run(lambda b: ds.get_replica_context().all_reduce("SUM", b["x"].sum(0)), args=(step,))
    np.testing.assert_array_equal(out.values[3], np.full(5, 2.0))


@pytest.mark.timeout(20)
def test_distribute_dataset_errors():
    s = ds.MirroredStrategy(cpus(2))
    it = iter(s.experimental_distribute_dataset([(np.ones(4), np.ones(3))]))
    with pytest.raises(ValueError, match="different batch sizes"):
        next(it)
    it = iter(s.experimental_distribute_dataset([np.float32(1)]))
    with pytest.raises(ValueError, match="batch on axis 0"):
        it.get_next()
    with pytest.raises(TypeError, match="iterable"):
        s.experimental_distribute_dataset(3)


@pytest.mark.timeout(20)
def test_distribute_datasets_from_function(strategy):
    n = strategy.num_replicas_in_sync
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        per_replica = ctx.get_per_replica_batch_size(2 * n)
        data = np.arange(2 * n * 3 + 2, dtype=np.float32)  # 3 full steps, then 2 leftover rows
        return [data[i : i + per_replica] for i in range(0, len(data), per_replica)]

    steps = list(strategy.distribute_datasets_from_function(dataset_fn))
    assert len(contexts) == 1
    ctx = contexts[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, n)
    assert len(steps) == 4
    first = strategy.experimental_local_results(steps[0])
    np.testing.assert_array_equal(np.concatenate(first), np.arange(2 * n))
    last = strategy.experimental_local_results(steps[-1])
    assert [len(p) for p in last] == [2] + [0] * (n - 1)
    with pytest.raises(ValueError, match="not divisible"):
        ds.InputContext(1, 0, 3).get_per_replica_batch_size(10)


@pytest.mark.timeout(20)
def test_distribute_datasets_from_function_per_replica():
    s = ds.MirroredStrategy(cpus(3))
    opts = ds.InputOptions(experimental_replication_mode=ds.InputReplicationMode.PER_REPLICA)
    steps = list(
        s.distribute_datasets_from_function(
            lambda ctx: [np.full(2, ctx.input_pipeline_id)] * 2, options=opts
        )
    )
    assert len(steps) == 2
    assert [int(p[0]) for p in s.experimental_local_results(steps[0])] == [0, 1, 2]


@pytest.mark.timeout(20)
def test_distributed_input_follows_a_re_formed_group(caplog):
    """After a lost worker the group re-forms in the same processes with another size and
    another index for this worker (MultiWorkerMirroredStrategy._rejoin, played here on the
    backend): a distributed dataset's next global batch is split for the new group, and a
    dataset function's pipelines are made again for the new InputContext."""
    s = ds.MirroredStrategy(cpus(2))
    backend = s.extended.backend
    backend.num_workers, backend.worker_index = 3, 1  # worker 1 of 3: replicas 2 and 3 of 6
    batches = [np.arange(12 * k, 12 * (k + 1), dtype=np.float32) for k in range(3)]
    it = iter(s.experimental_distribute_dataset(batches))
    first = s.experimental_local_results(next(it))
    np.testing.assert_array_equal(np.concatenate(first), np.arange(4, 8))

    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return [np.full(2, 10 * ctx.input_pipeline_id + k, np.float32) for k in range(4)]

    made = s.distribute_datasets_from_function(dataset_fn)
    it_fn = iter(made)
    got = s.experimental_local_results(next(it_fn))
    assert [float(p[0]) for p in got] == [10.0, 11.0]

    backend.num_workers, backend.worker_index = 2, 0  # re-formed: worker 0 of 2, 4 replicas
    second = s.experimental_local_results(next(it))
    np.testing.assert_array_equal(np.concatenate(second), np.arange(12, 18))  # rows 0-6 of 12
    with caplog.at_level("WARNING", logger="pycollective.strategies"):
        got = s.experimental_local_results(next(it_fn))
    assert [float(p[0]) for p in got] == [0.0, 1.0]  # pipeline 0 of 2, from its beginning
    assert contexts == [(3, 1, 6), (2, 0, 4)]
    assert "re-formed (worker 0 of 2, was 1 of 3)" in caplog.text
    # Another iterator over the same input uses the pipelines made for the new group.
    assert [float(p[0]) for p in s.experimental_local_results(next(iter(made)))] == [0.0, 1.0]
    assert len(contexts) == 2


# Extended -------------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_batch_reduce_to_issues_one_collective(strategy):
    n = strategy.num_replicas_in_sync
    backend = strategy.extended.backend
    calls = []
    original = backend._allreduce
    backend._allreduce = lambda arrays, op, owned=False: (
        calls.append(len(arrays[0])) or original(arrays, op, owned)
    )
    try:
        values = [
            strategy.experimental_distribute_values_from_function(
                lambda ctx, k=k: np.full((k + 1, 2), ctx.replica_id_in_sync_group + k, np.float32)
            )
            for k in range(6)
        ]
        out = strategy.extended.batch_reduce_to(ReduceOp.SUM, [(v, None) for v in values])
    finally:
        del backend._allreduce
    assert len(calls) == 1 and calls[0] == sum(2 * (k + 1) for k in range(6))
    for k, m in enumerate(out):
        assert isinstance(m, ds.Mirrored) and len(m.values) == n
        expect = sum(np.full((k + 1, 2), r + k, np.float32) for r in range(n))
        for comp in m.values:
            np.testing.assert_array_equal(comp, expect)


@pytest.mark.timeout(20)
def test_batch_reduce_to_packs():
    s = ds.MirroredStrategy(cpus(2))
    backend = s.extended.backend
    vals = [ds.PerReplica([np.ones(256, np.float32)] * 2) for _ in range(4)]  # 1 KiB each
    mixed = ds.PerReplica([np.ones(3, np.int64)] * 2)
    before = backend.call_counts["allreduce"]
    s.extended.batch_reduce_to("SUM", [(v, None) for v in vals] + [(mixed, None)])
    assert backend.call_counts["allreduce"] - before == 2  # one per dtype
    before = backend.call_counts["allreduce"]
    s.extended.batch_reduce_to(
        "SUM", [(v, None) for v in vals], options=ds.CommunicationOptions(bytes_per_pack=2048)
    )
    assert backend.call_counts["allreduce"] - before == 2  # two packs of 2 KiB
    s2 = ds.MirroredStrategy(cpus(2), cross_device_ops=ds.AlgorithmAllReduce("ring", num_packs=0))
    before = s2.extended.backend.call_counts["allreduce"]
    s2.extended.batch_reduce_to("SUM", [(v, None) for v in vals])
    assert s2.extended.backend.call_counts["allreduce"] - before == 4  # no packing


@pytest.mark.timeout(20)
def test_reduce_to_update_broadcast_to_and_friends():
    s = ds.MirroredStrategy(cpus(3))
    with s.scope():
        v = ds.Variable(np.zeros(2, np.float32), name="v")
    pr = s.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group + 1.0, np.float32)
    )
    m = s.extended.reduce_to(ReduceOp.MEAN, pr, destinations=v)
    assert isinstance(m, ds.Mirrored) and np.allclose(m.values[2], 2.0)
    single = s.extended.reduce_to("SUM", pr, destinations="/cpu:1")
    np.testing.assert_array_equal(single, np.full(2, 6.0))
    res = s.extended.update(
        v, lambda comp, delta: comp.assign_add(delta) and comp.numpy(), args=(m,)
    )
    assert isinstance(res, ds.Mirrored)
    for comp in v.values:
        np.testing.assert_array_equal(comp.numpy(), np.full(2, 2.0))
    b = s.extended.broadcast_to(np.arange(3.0), destinations=v)
    assert all(np.array_equal(x, np.arange(3.0)) for x in b.values)
    assert s.extended.variable_created_in_scope(v)
    assert s.extended.value_container(v.values[1]) is v
    assert len(s.extended.worker_devices) == 3
    with pytest.raises(RuntimeError, match="cross-replica"):
        s.run(lambda: s.extended.update(v, lambda c: None))
    with pytest.raises(TypeError, match="distributed variable"):
        s.extended.update(np.ones(2), lambda c: None)


# Torch ----------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_torch_tensors_in_replica_functions():
    torch = pytest.importorskip("torch")
    s = ds.MirroredStrategy(cpus(2))

    def fn():
        r = ds.get_replica_context().replica_id_in_sync_group
        ctx = ds.get_replica_context()
        t = torch.full((3,), float(r + 1))
        red = ctx.all_reduce("SUM", [t, t * 2])
        gat = ctx.all_gather(t.reshape(1, 3), axis=0)
        return red, gat, t

    red, gat, t = s.run(fn)
    assert isinstance(red[0].values[0], torch.Tensor)
    assert torch.equal(red[1].values[1], torch.full((3,), 6.0))
    assert gat.values[0].shape == (2, 3) and isinstance(gat.values[0], torch.Tensor)
    total = s.reduce("MEAN", t, axis=None)
    assert isinstance(total, torch.Tensor) and torch.allclose(total, torch.full((3,), 1.5))
    assert torch.allclose(s.reduce("SUM", t, axis=0), torch.tensor(9.0))


@pytest.mark.timeout(20)
def test_reduce_non_distributed_with_axis():
    s = ds.MirroredStrategy(cpus(3))
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(s.reduce("MEAN", x, axis=0), x.mean(0))
    # tf runs the sum along the axis on every replica, then adds the replicas' sums.
    np.testing.assert_array_equal(s.reduce("SUM", x, axis=0), 3 * x.sum(0))
    np.testing.assert_array_equal(s.reduce("SUM", x, axis=1), 3 * x.sum(1))
    with pytest.raises(ValueError, match="ReduceOp.SUM over 3 replicas"):
        s.reduce("SUM", x, axis=None)
    one = ds.MirroredStrategy(cpus(1))
    np.testing.assert_array_equal(one.reduce("SUM", x, axis=0), x.sum(0))
    mixed = s.reduce(
        "MEAN",
        {
            "a": x,
            "b": s.experimental_distribute_values_from_function(
                lambda ctx: np.full((2, 2), float(ctx.replica_id_in_sync_group))
            ),
        },
        axis=0,
    )
    np.testing.assert_array_equal(mixed["a"], x.mean(0))
    np.testing.assert_array_equal(mixed["b"], [1.0, 1.0])


@pytest.mark.timeout(20)
def test_make_packs():
    from pycollective.strategies.backend import make_packs

    a = [np.zeros(10, np.float32)] * 4 + [np.zeros(10, np.int32)] * 4  # 40 bytes each
    assert make_packs(a, 0, 1) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # one pack per dtype
    assert make_packs(a, 0, 0) == [[i] for i in range(8)]  # no packing
    assert make_packs(a, 0, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert make_packs(a, 80, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert make_packs([np.zeros(100)] * 2, 16, 1) == [[0], [1]]  # too big: a pack each
    s = ds.MirroredStrategy(cpus(2), cross_device_ops=ds.NcclAllReduce(num_packs=2))
    before = s.extended.backend.call_counts["allreduce"]
    s.run(lambda: ds.get_replica_context().all_reduce("SUM", [np.ones(8)] * 4))
    assert s.extended.backend.call_counts["allreduce"] - before == 2
