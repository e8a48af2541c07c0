"""MultiWorkerMirroredStrategy: TF_CONFIG resolution, communication options, the single-worker
case, and two worker processes started by ``pycollective run`` (when process groups exist)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from multiproc import run_ranks

import pycollective as pc
from pycollective import strategies as ds

TWO_WORKERS = {
    "cluster": {"worker": ["127.0.0.1:20000", "127.0.0.1:20001"]},
    "task": {"type": "worker", "index": 1},
}


@pytest.fixture
def tf_config(monkeypatch):
    def set_config(value):
        if value is None:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        else:
            monkeypatch.setenv("TF_CONFIG", value if isinstance(value, str) else json.dumps(value))

    for name in ("PYCOLLECTIVE_CPU_REPLICAS",):
        monkeypatch.delenv(name, raising=False)
    return set_config


# TFConfigClusterResolver ---------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_resolver_without_tf_config_is_a_single_worker(tf_config):
    tf_config(None)
    r = ds.TFConfigClusterResolver()
    assert r.cluster_spec().as_dict() == {} and not r.cluster_spec()
    assert (r.task_type, r.task_id, r.rpc_layer, r.master()) == (None, None, None, "")
    assert dict(r.num_accelerators()) == {}


@pytest.mark.timeout(10)
def test_resolver_reads_tf_config(tf_config):
    tf_config({**TWO_WORKERS, "rpc_layer": "grpc", "environment": "cloud"})
    r = ds.TFConfigClusterResolver()
    assert r.cluster_spec().as_dict() == TWO_WORKERS["cluster"]
    assert (r.task_type, r.task_id, r.rpc_layer, r.environment) == ("worker", 1, "grpc", "cloud")
    assert r.master() == "grpc://127.0.0.1:20001"
    assert r.master("worker", 0, rpc_layer="") == "grpc://127.0.0.1:20000"
    r.task_id = 0  # overrides are settable, as in tf
    assert r.task_id == 0
    spec = r.cluster_spec()
    assert spec.num_tasks("worker") == 2 and spec.job_tasks("worker")[1] == "127.0.0.1:20001"
    # Re-read on every call.
    tf_config(
        {"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {"type": "chief", "index": "0"}}
    )
    assert ds.TFConfigClusterResolver().task_id == 0
    assert ds.TFConfigClusterResolver().task_type == "chief"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "config, match",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}, 'no "task"'),
        ({**TWO_WORKERS, "task": {"type": "worker", "index": 5}}, "index out of range"),
        ({**TWO_WORKERS, "task": {"type": "ps", "index": 0}}, 'no job "ps"'),
        ({**TWO_WORKERS, "task": {"type": "worker", "index": -1}}, "non-negative integer"),
        ({**TWO_WORKERS, "task": {"index": 0}}, '"task.type" must be a job name'),
        (
            {"cluster": {"worker": "127.0.0.1:1"}, "task": {"type": "worker", "index": 0}},
            "must be a list",
        ),
        ({"cluster": {"worker": [5]}, "task": {"type": "worker", "index": 0}}, '"host:port"'),
    ],
)
def test_resolver_bad_tf_config_says_what_is_wrong(tf_config, config, match):
    tf_config(config)
    r = ds.TFConfigClusterResolver()  # never fails here, as in tf
    with pytest.raises(ValueError, match=match) as info:
        r.validate()
    assert "Expected a JSON object like TF_CONFIG=" in str(info.value)
    assert '"task": {"type": "worker", "index": 0}' in str(info.value)
    with pytest.raises(ValueError):
        ds.MultiWorkerMirroredStrategy()


@pytest.mark.timeout(10)
def test_simple_cluster_resolver():
    r = ds.SimpleClusterResolver(
        {"worker": ["a:1", "b:2"]}, task_type="worker", task_id=1, rpc_layer="grpc"
    )
    assert r.master("worker", 0) == "grpc://a:1" and r.cluster_spec().num_tasks("worker") == 2
    assert ds.ClusterSpec({"worker": {0: "a:1", 3: "b:2"}}).task_indices("worker") == [0, 3]
    with pytest.raises(ValueError, match="No task with index 1"):
        ds.ClusterSpec({"worker": {0: "a:1", 3: "b:2"}}).task_address("worker", 1)


# Communication options ------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_communication_options():
    o = ds.CommunicationOptions()
    assert (o.bytes_per_pack, o.timeout_seconds, o.implementation) == (
        0,
        None,
        ds.CommunicationImplementation.AUTO,
    )
    assert ds.CollectiveCommunication is ds.CommunicationImplementation
    o2 = ds.CommunicationOptions(bytes_per_pack=1024, timeout_seconds=5, implementation="ring")
    assert o2.implementation == ds.CommunicationImplementation.RING
    merged = o2.merge(ds.CommunicationOptions(bytes_per_pack=64))
    assert (merged.bytes_per_pack, merged.timeout_seconds) == (64, 5.0)
    for bad in ({"bytes_per_pack": -1}, {"timeout_seconds": 0}, {"implementation": "mpi"}):
        with pytest.raises(ValueError):
            ds.CommunicationOptions(**bad)


@pytest.mark.timeout(10)
def test_one_calls_options_reach_the_cross_worker_collectives():
    """A call's implementation and timeout (CollectiveBackend.call_options) set the algorithm
    and timeout of the process-group collectives across workers and of the worker's local
    steps, on this thread only, for that call only."""
    backend = ds.MultiWorkerBackend(1, "auto", timeout=60, worker_index=0, num_workers=2)
    seen = []
    with backend.call_options(2.5, "ring"):
        seen.append((backend._cross_algo, backend._local.call_algorithm, backend._kw()))
        other = threading.Thread(target=lambda: seen.append(backend._cross_algo))
        other.start()
        other.join()
    seen.append((backend._cross_algo, backend._local.call_algorithm, backend._kw()))
    assert seen[0][:2] == ("ring", "ring") and seen[1] == "auto"
    assert seen[2][:2] == ("auto", "auto")
    if backend._timeout_kw:  # the process group takes per-call timeouts
        assert seen[0][2]["timeout"] == 2.5 and seen[2][2]["timeout"] == 60.0


# Single worker --------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_single_worker_without_tf_config(tf_config, monkeypatch):
    tf_config(None)
    s = ds.MultiWorkerMirroredStrategy()
    assert s.num_replicas_in_sync == 1 and isinstance(s.extended.backend, ds.LocalBackend)
    assert s.cluster_resolver.cluster_spec().as_dict() == {}
    monkeypatch.setenv("PYCOLLECTIVE_CPU_REPLICAS", "3")
    s = ds.MultiWorkerMirroredStrategy(
        communication_options=ds.CommunicationOptions(
            implementation=ds.CommunicationImplementation.RING, timeout_seconds=7
        )
    )
    assert s.num_replicas_in_sync == 3 and s.extended.backend.algorithm == "ring"
    assert s.extended._timeout == 7.0
    assert s.extended.worker_devices[2] == "/job:worker/replica:0/task:0/device:CPU:2"
    out = s.run(lambda: ds.get_replica_context().all_reduce("SUM", np.ones(2)))
    np.testing.assert_array_equal(out.values[2], [3.0, 3.0])
    nccl = ds.MultiWorkerMirroredStrategy(
        communication_options=ds.CommunicationOptions(implementation="NCCL")
    )
    assert nccl.extended.backend.algorithm == "ring"  # CPU replicas: the ring
    old = ds.experimental.MultiWorkerMirroredStrategy(communication=ds.CollectiveCommunication.RING)
    assert old.extended.backend.algorithm == "ring"
    # tf.distribute.experimental also keeps these top-level names
    for name in (
        "ValueContext",
        "ParameterServerStrategy",
        "CentralStorageStrategy",
        "TPUStrategy",
    ):
        assert getattr(ds.experimental, name) is getattr(ds, name)
    assert ds.experimental.partitioners.MinSizePartitioner is ds.MinSizePartitioner


@pytest.mark.timeout(20)
def test_single_task_cluster_and_non_collective_tasks(tf_config):
    tf_config({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})
    assert ds.MultiWorkerMirroredStrategy().num_replicas_in_sync == 1
    resolver = ds.SimpleClusterResolver(
        {"worker": ["a:1", "b:2"], "ps": ["c:3"]}, task_type="ps", task_id=0
    )
    with pytest.raises(ValueError, match="chief and worker tasks.*'ps'"):
        ds.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    with pytest.raises(TypeError, match="CommunicationOptions"):
        ds.MultiWorkerMirroredStrategy(communication_options={"bytes_per_pack": 1})


# Two worker processes -------------------------------------------------------------------------------

WORKER_SCRIPT = textwrap.dedent("""
    import os
    import numpy as np
    import pycollective as pc
    from pycollective import strategies as ds

    strategy = ds.MultiWorkerMirroredStrategy(
        communication_options=ds.CommunicationOptions(timeout_seconds=30))
    rank = strategy.cluster_resolver.task_id
    n = strategy.num_replicas_in_sync
    assert n == 4, n
    assert isinstance(strategy.extended.backend, ds.MultiWorkerBackend)
    assert strategy.extended.should_checkpoint == (rank == 0)

    def ids():
        ctx = ds.get_replica_context()
        r = ctx.replica_id_in_sync_group
        return (ctx.all_reduce("SUM", np.array([r, 1.0])),
                ctx.all_gather(np.full((r + 1, 1), r, np.int64), axis=0),
                r)
    red, gat, mine = strategy.run(ids)
    assert [int(x) for x in strategy.experimental_local_results(mine)] == [2 * rank,
                                                                         2 * rank + 1]
    for v in strategy.experimental_local_results(red):
        assert v.tolist() == [6.0, 4.0], v
    for v in strategy.experimental_local_results(gat):
        assert v.ravel().tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3], v

    # Initial values come from the chief; updates aggregate over all 4 replicas.
    with strategy.scope():
        w = ds.Variable(np.full(3, float(rank + 7), np.float32), aggregation="mean")
        metric = ds.Variable(0.0, synchronization="on_read", aggregation="sum")
        opt = ds.SGD(0.1, momentum=0.9)
    assert w.numpy().tolist() == [7.0] * 3
    def update():
        r = ds.get_replica_context().replica_id_in_sync_group
        w.assign_add(np.full(3, float(r), np.float32))
        metric.assign_add(float(r + 1))
    strategy.run(update)
    assert np.allclose(w.numpy(), 7.0 + 1.5), w.numpy()
    assert float(metric.read_value()) == 10.0
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.array([ctx.replica_id_in_sync_group], np.float32))
    assert float(strategy.reduce("SUM", per_replica, axis=None)[0]) == 6.0
    assert strategy.gather(per_replica, axis=0).tolist() == [0.0, 1.0, 2.0, 3.0]

    # Training on global batches equals single-process training on the same batches.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], np.float32)
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 40, 8)]
    with strategy.scope():
        v = ds.Variable(np.zeros(3, np.float32))
    def step(batch):
        bx, by = batch
        g = 2 * bx.T @ (bx @ np.asarray(v) - by) / max(len(bx), 1)
        opt.apply_gradients([(g.astype(np.float32), v)])
    for _ in range(3):
        for batch in strategy.experimental_distribute_dataset(data):
            strategy.run(step, args=(batch,))
    ref, m = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for _ in range(3):
        for bx, by in data:
            g = 2 * bx.T @ (bx @ ref - by) / len(bx)
            m = 0.9 * m - 0.1 * g
            ref = ref + m
    assert np.allclose(v.numpy(), ref, rtol=1e-4, atol=1e-5), (v.numpy(), ref)
    path = ds.Checkpoint(v=v, metric=metric).write(os.path.join({tmp!r}, "mw.npz"))
    pc.barrier()
    assert os.path.exists(path)
    print(f"OK worker {{rank}}", flush=True)
    pc.shutdown()
""")


@pytest.mark.timeout(150)
def test_two_workers_with_pycollective_run(tmp_path):
    if not hasattr(pc, "init"):
        pytest.skip("pycollective has no process groups (pycollective.init) in this build")
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT.format(tmp=str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYCOLLECTIVE_CPU_REPLICAS="2", PYCOLLECTIVE_TIMEOUT="30")
    cmd = [
        sys.executable,
        "-m",
        "pycollective.cli",
        "run",
        "-n",
        "2",
        "--timeout",
        "100",
        sys.executable,
        str(script),
    ]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=130, cwd=str(tmp_path), check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK worker 0" in output and "OK worker 1" in output, output[-6000:]
    with np.load(tmp_path / "mw.npz", allow_pickle=False) as data:
        assert float(data["metric"]) == 10.0


ADOPT_SCRIPT = textwrap.dedent("""
    import os
    os.environ.pop("TF_CONFIG")  # only the process group says there are two workers
    import numpy as np
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    strategy = ds.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
    out = strategy.run(lambda: ds.get_replica_context().all_reduce("SUM", np.ones(2)))
    assert out.tolist() == [2.0, 2.0], out
    print(f"OK adopted {{pc.rank()}}", flush=True)
    pc.shutdown()
""")


@pytest.mark.timeout(90)
def test_process_group_without_tf_config_supplies_the_workers(tmp_path):
    if not hasattr(pc, "init"):
        pytest.skip("pycollective has no process groups (pycollective.init) in this build")
    script = tmp_path / "adopt.py"
    script.write_text(ADOPT_SCRIPT.format())
    env = {
        k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PYCOLLECTIVE_CPU_REPLICAS")
    }
    env.update(PYCOLLECTIVE_TIMEOUT="30")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective.cli",
            "run",
            "-n",
            "2",
            "--timeout",
            "60",
            sys.executable,
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "OK adopted 0" in output and "OK adopted 1" in output, output[-4000:]


def _fused_update_across_workers(rank, n, momentum):
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    strategy = ds.MultiWorkerMirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    assert replicas == n * strategy.extended._num_local_replicas
    shapes = [(70_000,), (5,), (2, 3), (4,)]  # 280 KB: all-reduced alone; the rest: one pack
    with strategy.scope():
        variables = [ds.Variable(np.ones(shape, np.float32)) for shape in shapes]
        opt = ds.SGD(0.5, momentum=momentum)

    def grads_of(replica, step):
        rng = np.random.default_rng(100 * step + replica)
        return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]

    def train_step(step):
        replica = ds.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients(zip(grads_of(replica, step), variables))

    backend = strategy.extended.backend
    before = dict(backend.call_counts)
    for step in range(3):
        strategy.run(train_step, args=(step,))
    calls = {
        kind: backend.call_counts[kind] - before.get(kind, 0)
        for kind in ("allreduce", "allreduce_update")
    }
    # Reference: (momentum) SGD in numpy with the mean over every replica's gradients.
    errors = []
    for i, shape in enumerate(shapes):
        w, m = np.ones(shape, np.float64), np.zeros(shape, np.float64)
        for step in range(3):
            g = np.mean([grads_of(r, step)[i] for r in range(replicas)], axis=0)
            m = momentum * m - 0.5 * g
            w = w + m
        errors.append(float(np.max(np.abs(variables[i].numpy() - w))))
    copies_equal = all(np.array_equal(c, v._arrays[0]) for v in variables for c in v._arrays)
    pc.shutdown()
    return {"calls": calls, "max_error": max(errors), "copies_equal": copies_equal}


# Plain SGD runs inside the all-reduce (fused_update.allreduce_apply); momentum updates from an
# all-reduced scratch buffer. One and two local replicas per worker.
@pytest.mark.timeout(90)
@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("local_replicas", [1, 2])
def test_fused_update_across_workers_matches_numpy(momentum, local_replicas):
    results = run_ranks(
        _fused_update_across_workers,
        2,
        momentum,
        timeout=60,
        env={"PYCOLLECTIVE_CPU_REPLICAS": str(local_replicas)},
    )
    # Per step: the large tensor alone (inside the all-reduce for plain SGD), and one pack.
    want = (
        {"allreduce": 3, "allreduce_update": 3}
        if momentum == 0
        else {"allreduce": 6, "allreduce_update": 0}
    )
    for res in results:
        assert res["calls"] == want, res
        assert res["max_error"] < 1e-5, res
        assert res["copies_equal"], res


def _plain_values_reduced(rank, n):
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    strategy = ds.MultiWorkerMirroredStrategy()
    x = np.arange(6.0).reshape(3, 2) + 10 * rank  # this worker's value, the same on its replicas
    sums = np.asarray(strategy.reduce("SUM", x, axis=0)).tolist()
    means = np.asarray(strategy.reduce("MEAN", x, axis=0)).tolist()
    pc.shutdown()
    return sums, means


# A plain value reduced along an axis is every local replica's value (tf runs the reduction on
# each replica), and each worker's own: the sums of every replica of every worker.
@pytest.mark.timeout(90)
def test_plain_values_along_an_axis_are_each_replicas_of_each_worker():
    results = run_ranks(
        _plain_values_reduced, 2, timeout=60, env={"PYCOLLECTIVE_CPU_REPLICAS": "2"}
    )
    xs = [np.arange(6.0).reshape(3, 2) + 10 * w for w in range(2)]
    want_sum = sum(2 * x.sum(axis=0) for x in xs).tolist()
    want_mean = np.concatenate(xs).mean(axis=0).tolist()
    for sums, means in results:
        assert sums == want_sum and means == want_mean, (sums, means)


def _compressed_gradients_only(rank, n):
    """compress= applies to the optimizer's gradient buckets (with error feedback), never to
    other float32 reductions: a reduced 1001.0 per worker must read back exactly."""
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    options = ds.CommunicationOptions(compress="bf16", error_feedback=True)
    strategy = ds.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        weights = ds.Variable(np.ones(1000, np.float32))
        opt = ds.SGD(0.5, momentum=0.5)
    grad = np.full(1000, 1 + 3 * 2.0**-9, np.float32)  # not a bfloat16 value

    def step():
        opt.apply_gradients([(grad, weights)])
        return np.float32(1001.0)

    totals = [float(strategy.reduce(ds.ReduceOp.SUM, strategy.run(step), axis=None))]
    feedback = strategy.extended.backend._feedback
    residues = {k: float(v[0]) for k, v in feedback._residues.items()}
    pc.shutdown()
    return totals, list(residues.values())


def test_compress_applies_to_gradients_only():
    env = {"PYCOLLECTIVE_CPU_REPLICAS": "1", "PYCOLLECTIVE_TRANSPORT": "tcp"}
    for totals, residues in run_ranks(_compressed_gradients_only, 2, timeout=60, env=env):
        assert totals == [2002.0]  # bfloat16 would have made it 2000.0
        # One bucket, keyed by its variable; its residue is the gradient's rounding: g - R(g).
        assert residues == [3 * 2.0**-9 - 4 * 2.0**-9]
