"""ParameterServerStrategy without servers: partitioners (tf's table), the wire format, signed
payloads, and the one-machine mode (CentralStorageStrategy behaviour) with its coordinator."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective.strategies import (
    SGD,
    Adam,
    ClusterCoordinator,
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    MirroredStrategy,
    ParameterServerStrategy,
    ReduceOp,
    SimpleClusterResolver,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)
from pycollective.strategies.parameter_server import OutOfRangeError, wire
from pycollective.strategies.parameter_server import ps_pb2 as pb
from pycollective.strategies.parameter_server.partitioners import shard_rows

pytestmark = pytest.mark.timeout(30)


# Partitioners: the live outputs of tf 2.21 (shared/reference/tf-distribute-api.md §9) ------------

SHAPES = [(6, 1), (10, 3), (1000, 64)]
TF_TABLE = [
    (FixedShardsPartitioner(2), [[2, 1], [2, 1], [2, 1]]),
    (FixedShardsPartitioner(8), [[6, 1], [8, 1], [8, 1]]),
    (MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=2), [[1, 1], [1, 1], [1, 1]]),
    (MinSizePartitioner(min_shard_bytes=4, max_shards=4), [[4, 1], [4, 1], [4, 1]]),
    (MaxSizePartitioner(max_shard_bytes=4), [[6, 1], [10, 1], [1000, 1]]),
    (MaxSizePartitioner(max_shard_bytes=4, max_shards=2), [[2, 1], [2, 1], [2, 1]]),
    (MaxSizePartitioner(max_shard_bytes=1024), [[1, 1], [1, 1], [250, 1]]),
]


@pytest.mark.parametrize("partitioner,expected", TF_TABLE, ids=[repr(p) for p, _ in TF_TABLE])
def test_partitioners_match_tensorflow(partitioner, expected):
    assert [partitioner(shape, np.float32) for shape in SHAPES] == expected


def test_partitioner_arguments_and_shard_rows():
    with pytest.raises(ValueError):
        FixedShardsPartitioner(0)
    with pytest.raises(ValueError):
        MaxSizePartitioner(0)
    assert MinSizePartitioner()((1 << 20,), np.float32) == [1]  # default max_shards=1
    assert shard_rows(7, 2) == [(0, 4), (4, 7)]
    assert shard_rows(6, 3) == [(0, 2), (2, 4), (4, 6)]


# Wire format -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int8", "bool", "complex64"])
def test_tensor_round_trip(dtype):
    x = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    back = wire.decode_tensor(wire.encode_tensor(x))
    assert back.dtype == x.dtype and back.shape == x.shape
    np.testing.assert_array_equal(back, x)
    assert wire.decode_tensor(wire.encode_tensor(np.float32(2.5))).shape == ()


def test_malformed_tensors_are_refused():
    with pytest.raises(TypeError):
        wire.encode_tensor(np.array(["a"], dtype=object))
    with pytest.raises(ValueError, match="numeric"):
        wire.decode_tensor(pb.Tensor(dtype="|O", shape=[1], data=b"\0" * 8))
    with pytest.raises(ValueError, match="bytes"):
        wire.decode_tensor(pb.Tensor(dtype="<f4", shape=[3], data=b"\0" * 8))
    with pytest.raises(ValueError, match="shape"):
        wire.decode_tensor(pb.Tensor(dtype="<f4", shape=[-1], data=b""))


def test_values_round_trip_without_pickle():
    value = {"loss": np.float32(0.5), "parts": [np.ones(3), (1, "x", None)]}
    back = wire.decode_value(wire.encode_value(value))
    assert back["loss"] == np.float32(0.5)
    np.testing.assert_array_equal(back["parts"][0], np.ones(3))
    assert back["parts"][1] == (1, "x", None)
    with pytest.raises(TypeError, match="cannot travel back"):
        wire.encode_value(object())


def test_signed_payloads():
    key = wire.payload_key("secret")
    body, tensors = wire.dumps((len, np.arange(3.0)))
    assert len(tensors) == 1  # the array travels as a Tensor, outside the pickle
    payload = wire.sign(key, "closure", body, tensors)
    assert wire.verify(key, payload, "closure")
    fn, arr = wire.loads(payload)
    assert fn is len and arr.tolist() == [0.0, 1.0, 2.0]
    assert not wire.verify(wire.payload_key("other"), payload, "closure")
    assert not wire.verify(key, payload, "optimizer")  # the kind is part of the MAC
    tampered = pb.SignedPayload()
    tampered.CopyFrom(payload)
    tampered.tensors[0].data = np.arange(1.0, 4.0).tobytes()
    assert not wire.verify(key, tampered, "closure")
    tampered.CopyFrom(payload)
    tampered.body = payload.body[:-1] + bytes([payload.body[-1] ^ 1])
    assert not wire.verify(key, tampered, "closure")


def test_cluster_needs_a_token_and_ps_tasks(monkeypatch):
    monkeypatch.delenv("PYCOLLECTIVE_TOKEN", raising=False)
    spec = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    with pytest.raises(ValueError, match="PYCOLLECTIVE_TOKEN"):
        ParameterServerStrategy(SimpleClusterResolver(spec, task_type="chief", task_id=0))
    with pytest.raises(ValueError, match="'ps' tasks"):
        ParameterServerStrategy(
            SimpleClusterResolver({"worker": ["127.0.0.1:2"]}, task_type="worker", task_id=0)
        )
    with pytest.raises(ValueError, match="update_mode"):
        ParameterServerStrategy(update_mode="eventually")


# One machine ------------------------------------------------------------------------------------------


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    return x, y


def _train(strategy, make_opt, steps=8, batch=24):
    x, y = _data()
    with strategy.scope():
        w = Variable(np.zeros((8, 3), np.float32), name="w")
        b = Variable(np.zeros(3, np.float32), name="b")
        opt = make_opt()

    def step(batch_xy, global_batch):
        xb, yb = batch_xy
        logits = xb @ np.asarray(w) + np.asarray(b)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        d = (p / global_batch).astype(np.float32)
        opt.apply_gradients([(xb.T @ d, w), (d.sum(0), b)])

    for i in range(steps):
        sl = slice((i * batch) % len(x), (i * batch) % len(x) + batch)
        for dist in strategy.experimental_distribute_dataset([(x[sl], y[sl])]):
            strategy.run(step, args=(dist, batch))
    return w.read_value(), b.read_value(), int(opt.iterations.read_value())


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda: SGD(0.5, momentum=0.9, gradient_aggregation=ReduceOp.SUM),
        lambda: Adam(0.05, gradient_aggregation=ReduceOp.SUM),
    ],
    ids=["sgd-momentum", "adam"],
)
def test_one_machine_equals_one_replica(make_opt):
    strategy = ParameterServerStrategy(compute_devices=["/cpu:0", "/cpu:1", "/cpu:2"])
    assert not strategy.is_cluster and strategy.num_replicas_in_sync == 3
    w, b, it = _train(strategy, make_opt)
    w1, b1, it1 = _train(MirroredStrategy(["/cpu:0"]), make_opt)
    np.testing.assert_allclose(w, w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, b1, rtol=1e-5, atol=1e-6)
    assert it == it1 == 8


def test_one_machine_keeps_one_copy_on_the_parameter_device():
    strategy = ParameterServerStrategy(compute_devices=["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = Variable(np.zeros(2, np.float32), aggregation=VariableAggregation.MEAN)
        counter = Variable(
            0.0,
            synchronization=VariableSynchronization.ON_READ,
            aggregation=VariableAggregation.SUM,
        )
    assert strategy.extended.parameter_devices == (v.device,)
    assert len(v.values) == 1

    def replica_fn():
        ctx = v._replica_id()
        v.assign_add(np.full(2, float(ctx + 1), np.float32))  # MEAN of 1 and 2 -> 1.5
        counter.assign_add(1.0)

    strategy.run(replica_fn)
    np.testing.assert_allclose(v.read_value(), [1.5, 1.5])
    assert float(counter.read_value()) == 2.0


def test_one_machine_coordinator():
    strategy = ParameterServerStrategy(compute_devices=["/cpu:0", "/cpu:1"])
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros(2, np.float32))
    dataset = coordinator.create_per_worker_dataset(lambda: iter([1.0, 2.0]))
    it = iter(dataset)

    def fn(iterator, extra):
        return next(iterator) + np.asarray(v) + extra

    first = coordinator.schedule(fn, args=(it, 1.0))
    second = coordinator.schedule(fn, args=(it,), kwargs={"extra": first})
    coordinator.join()
    np.testing.assert_allclose(first.fetch(), [2.0, 2.0])
    np.testing.assert_allclose(second.fetch(), [4.0, 4.0])
    third = coordinator.schedule(fn, args=(it, 0.0))
    with pytest.raises(OutOfRangeError):
        coordinator.join()
    with pytest.raises(OutOfRangeError):
        third.fetch()
    assert coordinator.done()
    coordinator.close()


def test_function_out_of_attempts_cancels_the_queue():
    """A function that failed on MAX_ATTEMPTS workers fails for good like any other failure:
    the functions queued behind it are cancelled and join() raises its error."""
    import threading

    from pycollective.strategies.parameter_server import coordinator as coord
    from pycollective.strategies.parameter_server.errors import CancelledError, UnavailableError

    coordinator = ClusterCoordinator(ParameterServerStrategy(compute_devices=["/cpu:0"]))
    started, release = threading.Event(), threading.Event()

    def blocker():  # holds the one-machine dispatcher while the queue is looked at
        started.set()
        release.wait(10)

    coordinator.schedule(blocker)
    assert started.wait(10)
    queued = coordinator.schedule(lambda: 1)
    lost = coord._Closure(10_000, blocker, (), {}, coord.RemoteValue(coordinator, 10_000, "lost"))
    lost.attempts = coord.MAX_ATTEMPTS - 1
    with coordinator._cond:
        coordinator._inflight += 1  # as a remote worker's dispatcher had taken it
    coordinator._requeue(lost, "worker:1: unreachable")
    with pytest.raises(CancelledError, match="failed on 5 workers"):
        queued.fetch()
    release.set()
    with pytest.raises(UnavailableError, match="failed on 5 workers"):
        coordinator.join()
    coordinator.close()


class _Refused(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _Context:
    """The part of a gRPC handler context a synchronous push uses: its caller's deadline."""

    def __init__(self, seconds):
        self._deadline = __import__("time").monotonic() + seconds

    def time_remaining(self):
        return self._deadline - __import__("time").monotonic()

    def is_active(self):
        return True

    def abort(self, code, message):
        raise _Refused(code, message)


def test_sync_step_that_gave_up_withdraws_its_gradient():
    """A synchronous push that gave up waiting for the other workers takes its gradient back:
    the next step must be made of that step's gradients only, not of the failed one's."""
    import threading

    import grpc

    from pycollective.strategies.parameter_server.ps_service import (
        _ANSWER_MARGIN_S,
        ParameterServerService,
        _OptimizerState,
        _Var,
    )

    service = ParameterServerService(b"key", 0, "test")
    service._vars["w"] = _Var(np.zeros(3, np.float32), True)
    service._opts["sgd"] = _OptimizerState(SGD(1.0))
    service._sync_replicas = 2

    def push(worker, value, seconds):
        request = pb.PushRequest(keys=["w"], optimizer_id="sgd", synchronous=True, worker=worker)
        grads = [np.full(3, value, np.float32)]
        return service._push(request, grads, _Context(seconds), None)

    with pytest.raises(_Refused) as refused:  # worker 1 never comes for this step
        push(0, 1.0, _ANSWER_MARGIN_S + 0.2)
    assert refused.value.code == grpc.StatusCode.ABORTED  # answered: the task is not lost
    assert "withdrawn" in str(refused.value)
    other = threading.Thread(target=push, args=(1, 3.0, 10.0))
    other.start()
    push(0, 5.0, 10.0)
    other.join(10)
    # One step, of the gradients 3 and 5 (their mean with SGD(1.0)), not of the withdrawn 1.
    np.testing.assert_allclose(service._vars["w"].array, np.full(3, -4.0))
    assert service._opts["sgd"].version == 1
