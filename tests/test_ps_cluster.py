"""ParameterServerStrategy on a cluster of in-process tasks: 2 ps + 2 workers, each a real gRPC
Server on an OS-chosen port of this process (the coordinator talks to them over the network
stack exactly as to other processes; tests/test_ps_faults.py uses processes).

Covers: synchronous training equals one replica on the same batches, asynchronous training
reaches 0.9 accuracy on digits, a 2-shard variable spread over both ps tasks, checkpoints of
variables and optimizer slots, errors of scheduled functions, and refusal of unauthenticated or
tampered calls (nothing unpickled)."""

from __future__ import annotations

import logging
import os
import pickle

import grpc
import numpy as np
import pytest

from pycollective.strategies import (
    SGD,
    Adam,
    Checkpoint,
    ClusterCoordinator,
    FixedShardsPartitioner,
    MirroredStrategy,
    ParameterServerStrategy,
    Server,
    ShardedVariable,
    SimpleClusterResolver,
    Variable,
)
from pycollective.strategies.parameter_server import ClosureError, wire
from pycollective.strategies.parameter_server import ps_pb2 as pb
from pycollective.strategies.parameter_server import ps_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

TOKEN = "test-cluster-token"


@pytest.fixture(scope="module")
def cluster():
    """2 ps and 2 worker tasks in this process; yields the chief's cluster dict."""
    placeholder = {"ps": ["127.0.0.1:0"] * 2, "worker": ["127.0.0.1:0"] * 2}
    servers = [
        Server(placeholder, job, i, token=TOKEN)
        for job, i in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1))
    ]
    yield {
        "chief": ["127.0.0.1:1"],
        "ps": [s.address for s in servers[:2]],
        "worker": [s.address for s in servers[2:]],
    }
    for s in servers:
        s.stop(0)


def make_strategy(cluster, **kwargs):
    kwargs.setdefault("rpc_timeout", 10)
    kwargs.setdefault("closure_timeout", 30)
    return ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0), token=TOKEN, **kwargs
    )


# A small softmax-regression model with hand-written gradients ------------------------------------


def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order].astype(np.int64)
    return (x[360:], y[360:]), (x[:360], y[:360])


class Softmax:
    def __init__(self, n_in=64, n_out=10):
        self.w = Variable(np.zeros((n_in, n_out), np.float32), name="w")
        self.b = Variable(np.zeros(n_out, np.float32), name="b")

    @property
    def variables(self):
        return [self.w, self.b]

    def logits(self, x):
        return x @ np.asarray(self.w) + np.asarray(self.b)

    def loss_and_gradients(self, x, y, scale):
        logits = self.logits(x)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum()
        p[np.arange(len(y)), y] -= 1.0
        d = (p / scale).astype(np.float32)
        return loss, [x.T @ d, d.sum(axis=0)]


def step_on_batch(model, optimizer, x, y):
    loss, grads = model.loss_and_gradients(x, y, len(y))
    optimizer.apply_gradients(zip(grads, model.variables))
    return loss / len(y)


def step_on_iterator(model, optimizer, iterator):
    x, y = next(iterator)
    return step_on_batch(model, optimizer, x, y)


# Tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_opt", [lambda: SGD(0.5, momentum=0.9), lambda: Adam(0.02)], ids=["sgd-momentum", "adam"]
)
def test_sync_equals_single_replica(cluster, make_opt):
    (x, y), _ = digits()
    steps, half = 12, 16
    strategy = make_strategy(
        cluster, update_mode="sync", variable_partitioner=FixedShardsPartitioner(2)
    )
    assert strategy.num_replicas_in_sync == 2
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        model, opt = Softmax(), make_opt()
    assert isinstance(model.w, ShardedVariable)
    for k in range(steps):
        xb, yb = x[k * 2 * half : (k + 1) * 2 * half], y[k * 2 * half : (k + 1) * 2 * half]
        # One function per worker and step: each worker's gradient is the mean over its half;
        # the ps averages the two, i.e. the mean over the whole batch.
        coordinator.schedule(step_on_batch, args=(model, opt, xb[:half], yb[:half]))
        coordinator.schedule(step_on_batch, args=(model, opt, xb[half:], yb[half:]))
    coordinator.join()
    coordinator.close()

    reference = MirroredStrategy(["/cpu:0"])
    with reference.scope():
        ref_model, ref_opt = Softmax(), make_opt()
    for k in range(steps):
        xb, yb = x[k * 2 * half : (k + 1) * 2 * half], y[k * 2 * half : (k + 1) * 2 * half]
        reference.run(step_on_batch, args=(ref_model, ref_opt, xb, yb))
    np.testing.assert_allclose(model.w.read_value(), ref_model.w.read_value(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.b.read_value(), ref_model.b.read_value(), rtol=1e-5, atol=1e-6)
    assert int(opt.iterations.read_value()) == steps


def test_async_training_reaches_90_percent(cluster):
    (x_train, y_train), (x_test, y_test) = digits()
    strategy = make_strategy(cluster)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        model, opt = Softmax(), SGD(0.5)

    def dataset_fn(input_context):
        rng = np.random.default_rng(input_context.input_pipeline_id)
        while True:
            rows = rng.integers(0, len(x_train), 32)
            yield x_train[rows], y_train[rows]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    losses = [
        coordinator.schedule(step_on_iterator, args=(model, opt, iterator)) for _ in range(160)
    ]
    coordinator.join()
    coordinator.close()
    assert {rv.worker for rv in losses} == {
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    }
    assert np.mean([rv.fetch() for rv in losses[-20:]]) < np.mean(
        [rv.fetch() for rv in losses[:20]]
    )
    accuracy = (model.logits(x_test).argmax(1) == y_test).mean()
    assert accuracy >= 0.9, accuracy
    assert int(opt.iterations.read_value()) == 160  # each worker's push applied on arrival


def test_partitioned_variable_spans_both_ps(cluster):
    strategy = make_strategy(cluster, variable_partitioner=FixedShardsPartitioner(2))
    coordinator = ClusterCoordinator(strategy)
    initial = np.arange(21, dtype=np.float32).reshape(7, 3)
    with strategy.scope():
        v = Variable(initial, name="table")
        scalar = Variable(1.0, name="scalar")  # scalars are never partitioned
        opt = SGD(0.5)
    assert isinstance(v, ShardedVariable) and len(v.variables) == 2
    assert [s.shape for s in v.variables] == [(4, 3), (3, 3)]
    assert [s.device for s in v.variables] == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    assert not isinstance(scalar, ShardedVariable)
    # Each ps task really holds its shard.
    for shard, address, rows in zip(v.variables, cluster["ps"], (slice(0, 4), slice(4, 7))):
        stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(address))
        resp = stub.Pull(
            pb.PullRequest(keys=[shard._shards[0].key]), timeout=5, metadata=wire.metadata(TOKEN)
        )
        np.testing.assert_array_equal(wire.decode_tensor(resp.values[0]), initial[rows])
    np.testing.assert_array_equal(np.asarray(v), initial)
    v.assign_add(np.ones((7, 3), np.float32))
    np.testing.assert_array_equal(v.read_value(), initial + 1)

    def push(var, optimizer):
        optimizer.apply_gradients([(np.ones(var.shape, np.float32), var)])
        return np.asarray(var)  # read after the push: pulled again

    after = coordinator.schedule(push, args=(v, opt)).fetch()
    np.testing.assert_array_equal(after, initial + 0.5)
    np.testing.assert_array_equal(v.variables[1].read_value(), initial[4:] + 0.5)
    coordinator.close()


def test_checkpoint_of_variables_and_optimizer_state(cluster, tmp_path):
    (x, y), _ = digits()
    strategy = make_strategy(cluster, variable_partitioner=FixedShardsPartitioner(2))
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        model, opt = Softmax(), Adam(0.05)
    for k in range(4):
        coordinator.schedule(
            step_on_batch, args=(model, opt, x[k * 32 : (k + 1) * 32], y[k * 32 : (k + 1) * 32])
        )
    coordinator.join()
    ckpt = Checkpoint(model=model, optimizer=opt)
    path = ckpt.write(str(tmp_path / "ps.npz"))
    saved_w, saved_m = model.w.read_value(), opt.get_slot(model.w, "m").read_value()
    assert np.abs(saved_m).sum() > 0
    for _ in range(3):
        coordinator.schedule(step_on_batch, args=(model, opt, x[:32], y[:32]))
    coordinator.join()
    assert not np.array_equal(model.w.read_value(), saved_w)
    status = ckpt.restore(path)
    status.assert_consumed()
    np.testing.assert_array_equal(model.w.read_value(), saved_w)
    np.testing.assert_array_equal(opt.get_slot(model.w, "m").read_value(), saved_m)
    assert int(opt.iterations.read_value()) == 4
    coordinator.close()


def fail(message):
    raise ValueError(message)


def test_errors_of_scheduled_functions(cluster):
    strategy = make_strategy(cluster)
    coordinator = ClusterCoordinator(strategy)
    bad = coordinator.schedule(fail, args=("boom",))
    with pytest.raises(ClosureError, match="boom") as info:
        coordinator.join()
    assert info.value.exception_type == "ValueError" and "Remote traceback" in str(info.value)
    with pytest.raises(ClosureError):
        bad.fetch()
    assert coordinator.done()  # the error was raised once
    assert coordinator.schedule(len, args=([1, 2, 3],)).fetch() == 3
    with pytest.raises(TypeError, match="cannot use the ClusterCoordinator"):
        coordinator.schedule(len, args=(coordinator,))
    coordinator.close()


# Authentication ----------------------------------------------------------------------------------------


class _Trap:
    """Unpickling this would create a directory: proof of code execution."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_unauthenticated_or_tampered_messages_are_refused(cluster, tmp_path, caplog):
    trap = str(tmp_path / "unpickled")
    body = pickle.dumps(({}, _Trap(trap), (), {}))
    worker = pb_grpc.WorkerStub(grpc.insecure_channel(cluster["worker"][0]))
    ps = pb_grpc.ParameterServerStub(grpc.insecure_channel(cluster["ps"][0]))
    good_md = wire.metadata(TOKEN)

    def code_of(call, request, metadata):
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=5, metadata=metadata)
        return info.value.code()

    signed = wire.sign(wire.payload_key(TOKEN), "closure", body)
    request = pb.RunClosureRequest(closure_id=1, closure=signed)
    # No token, or a wrong one: refused before any handler runs.
    assert code_of(worker.RunClosure, request, None) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        code_of(worker.RunClosure, request, wire.metadata("wrong"))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert code_of(ps.Pull, pb.PullRequest(keys=["x"]), None) == grpc.StatusCode.UNAUTHENTICATED
    # Streaming calls too.
    with pytest.raises(grpc.RpcError) as info:
        list(ps.PullStream(pb.PullRequest(keys=["x"]), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    chunks = iter([pb.AssignChunk(header=pb.AssignRequest(keys=["x"], kind="assign"))])
    assert (
        code_of(ps.AssignStream, chunks, wire.metadata("wrong")) == grpc.StatusCode.UNAUTHENTICATED
    )
    caplog.set_level(logging.WARNING, logger="pycollective.strategies.parameter_server")
    # The right token, but a payload signed with another key, or altered after signing.
    forged = pb.RunClosureRequest(
        closure_id=2, closure=wire.sign(wire.payload_key("other"), "closure", body)
    )
    assert code_of(worker.RunClosure, forged, good_md) == grpc.StatusCode.UNAUTHENTICATED
    tampered = pb.RunClosureRequest()
    tampered.CopyFrom(request)
    tampered.closure.body = body + b"."
    assert code_of(worker.RunClosure, tampered, good_md) == grpc.StatusCode.UNAUTHENTICATED
    wrong_kind = pb.RegisterOptimizerRequest(optimizer_id="x", spec=signed)  # a closure
    assert code_of(ps.RegisterOptimizer, wrong_kind, good_md) == grpc.StatusCode.UNAUTHENTICATED
    assert not os.path.exists(trap)  # nothing was unpickled
    assert "HMAC does not match" in caplog.text


def add(a, b):
    return a + b


def test_remote_values_as_arguments(cluster):
    strategy = make_strategy(cluster)
    coordinator = ClusterCoordinator(strategy)
    first = coordinator.schedule(add, args=(np.ones(3), 1.0))
    second = coordinator.schedule(add, args=(first, first))
    third = coordinator.schedule(add, args=(second,), kwargs={"b": np.arange(3.0)})
    np.testing.assert_array_equal(third.fetch(), [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(coordinator.fetch([first, second]), [[2.0] * 3, [4.0] * 3])
    coordinator.close()


def push_and_read(var, optimizer, grad):
    optimizer.apply_gradients([(grad, var)])
    return np.asarray(var)


def test_large_tensors_stream_in_chunks(cluster):
    from pycollective.strategies.parameter_server import client

    strategy = make_strategy(cluster)
    coordinator = ClusterCoordinator(strategy)
    shape = (1301, 1031)  # 5.4 MB: streamed, and not a whole number of chunks
    assert np.prod(shape) * 4 > client.STREAM_BYTES
    rng = np.random.default_rng(0)
    initial = rng.normal(size=shape).astype(np.float32)
    grad = rng.normal(size=shape).astype(np.float32)
    with strategy.scope():
        v = Variable(initial, name="big")
        opt = SGD(0.5)
    np.testing.assert_array_equal(v.read_value(), initial)
    v.assign_sub(np.ones(shape, np.float32))
    after = coordinator.schedule(push_and_read, args=(v, opt, grad)).fetch()
    np.testing.assert_allclose(after, initial - 1 - 0.5 * grad, rtol=1e-6)
    np.testing.assert_array_equal(v.read_value(), after)
    coordinator.close()
