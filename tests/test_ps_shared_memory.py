"""Data-plane channels to a ps task on the same host send their tensor frames through shared
memory (pycollective.channel.Channel.use_shared_memory, strategies/parameter_server/data_plane.py).

Covers: tensors larger than the ring cross exact both ways (pull, push applied with the
optimizer's arithmetic, assign); a client that offers from another host, or when
PYCOLLECTIVE_TRANSPORT forces tcp, stays on tcp, and so does one that cannot open the segment;
a message whose shared-memory frames never come is refused with an error naming the task,
which keeps serving; a channel whose client left is dropped."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from pycollective import config
from pycollective.channel import Channel, connect
from pycollective.errors import CollectiveError
from pycollective.strategies import (
    SGD,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    Server,
    SimpleClusterResolver,
    Variable,
)
from pycollective.strategies.parameter_server import ps_pb2 as pb
from pycollective.strategies.parameter_server.data_client import DataPlaneClient
from pycollective.strategies.parameter_server.data_plane import session
from pycollective.strategies.parameter_server.framing import (
    BLOCK,
    receive_header,
    receive_tensors,
    send_message,
)

pytestmark = pytest.mark.timeout(120)

TOKEN = "shm-token"
RING = 1 << 20  # small ring: every tensor below wraps it many times


@pytest.fixture(scope="module")
def servers():
    """2 ps tasks and 1 worker task in this process, with 1 MiB shared-memory rings."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYCOLLECTIVE_SHM_RING_BYTES", str(RING))
    config.reload()
    placeholder = {"ps": ["127.0.0.1:0"] * 2, "worker": ["127.0.0.1:0"]}
    tasks = [Server(placeholder, "ps", i, token=TOKEN) for i in range(2)]
    tasks.append(Server(placeholder, "worker", 0, token=TOKEN))
    yield tasks
    for s in tasks:
        s.stop(0)
    mp.undo()
    config.reload()


def make_strategy(servers):
    cluster = {
        "chief": ["127.0.0.1:1"],
        "ps": [s.address for s in servers[:2]],
        "worker": [servers[2].address],
    }
    return ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0),
        variable_partitioner=FixedShardsPartitioner(2),
        token=TOKEN,
        rpc_timeout=20,
    )


def open_channel(server, offer_host=None):
    """A data channel to ``server`` that went through the client's shared-memory offer (with
    ``offer_host`` instead of this host's identity when given) and one served request."""
    client = DataPlaneClient(TOKEN, None, None)
    host = server.address.rpartition(":")[0]
    channel = connect(
        f"{host}:{server._data_plane.port}", TOKEN, session(server.task), 10, peer_name="ps"
    )
    if offer_host is None:
        client._move_to_shared_memory(channel, 10)
    else:
        block = np.empty(BLOCK, np.uint8)
        offer = pb.DataRequest(shm=pb.ShmOffer(host=offer_host))
        send_message(channel, block, offer, [])
        reply, inline = receive_header(channel, block, pb.DataReply, 10)
        receive_tensors(channel, inline, [], 10)
        assert reply.shm_segment == ""
    refused_round_trip(channel, server)
    return channel


def refused_round_trip(channel, server):
    """A request the task refuses (an unknown variable) and its reply, over ``channel``: the
    task serves it (after adding shared memory to it, when it did)."""
    block = np.empty(BLOCK, np.uint8)
    send_message(channel, block, pb.DataRequest(pull=pb.PullRequest(keys=["nothing"])), [])
    reply, inline = receive_header(channel, block, pb.DataReply, 10)
    receive_tensors(channel, inline, [], 10)
    assert server.task in reply.error and "nothing" in reply.error


def test_tensors_larger_than_the_ring_cross_shared_memory_exact(servers):
    strategy = make_strategy(servers)
    rng = np.random.default_rng(3)
    start = rng.standard_normal((1001, 777)).astype(np.float32)  # 3 MiB, 2 shards
    with strategy.scope():
        v = Variable(start, name="big")
        opt = SGD(0.25, momentum=0.5)
    np.testing.assert_array_equal(v.numpy(), start)

    expected, momentum = start.copy(), np.zeros_like(start)
    for _ in range(3):
        grad = rng.standard_normal(start.shape).astype(np.float32)
        strategy.extended.push_gradients(opt, [(grad, v)])
        momentum = np.float32(0.5) * momentum + grad
        expected = expected - np.float32(0.25) * momentum
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert int(opt.iterations.numpy()) == 3

    value = rng.standard_normal(start.shape).astype(np.float32)
    v.assign(value)
    np.testing.assert_array_equal(v.numpy(), value)

    pools = strategy.extended.client._data._pools.values()
    channels = [c for pool in pools if pool is not None for c in pool.free]
    assert channels and all(c.transport == "shm" for c in channels)


def test_a_client_from_another_host_stays_on_tcp(servers):
    channel = open_channel(servers[0], offer_host="another-host|boot|0:0")
    assert channel.transport == "tcp"
    channel.close()


def test_forcing_tcp_keeps_channels_on_tcp(servers, monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_TRANSPORT", "tcp")
    config.reload()
    try:
        strategy = make_strategy(servers)
        with strategy.scope():
            v = Variable(np.arange(12, dtype=np.float32).reshape(6, 2), name="on-tcp")
        np.testing.assert_array_equal(v.numpy(), np.arange(12, dtype=np.float32).reshape(6, 2))
        pools = strategy.extended.client._data._pools.values()
        channels = [c for pool in pools if pool is not None for c in pool.free]
        assert channels and all(c.transport == "tcp" for c in channels)
    finally:
        monkeypatch.delenv("PYCOLLECTIVE_TRANSPORT")
        config.reload()


def wait_for_failure(server, count):
    deadline = time.monotonic() + 20
    while len(server.data_plane_failures) < count:
        assert time.monotonic() < deadline, "the ps task did not report the broken message"
        time.sleep(0.02)
    return server.data_plane_failures[count - 1]


def test_a_message_cut_short_over_shared_memory_is_refused_and_the_task_keeps_serving(servers):
    ps = servers[0]
    before = len(ps.data_plane_failures)
    channel = open_channel(ps)
    assert channel.transport == "shm"
    # A push announcing a 4 MiB gradient, whose bytes never come: the client goes away.
    request = pb.DataRequest(
        push=pb.PushRequest(
            optimizer_id="none",
            keys=["nothing"],
            gradients=[pb.Tensor(dtype=np.dtype(np.float32).str, shape=[1 << 20])],
        )
    )
    send_message(channel, np.empty(BLOCK, np.uint8), request, [])
    channel.close("the test client went away mid-message")
    message = wait_for_failure(ps, before + 1)
    assert ps.task in message and "closed that channel" in message

    strategy = make_strategy(servers)
    with strategy.scope():
        w = Variable(np.arange(8, dtype=np.float32), name="after-the-cut")
    np.testing.assert_array_equal(w.numpy(), np.arange(8, dtype=np.float32))


def test_a_channel_whose_client_left_is_dropped_quietly(servers):
    ps = servers[1]
    before = len(ps.data_plane_failures)

    def served() -> int:
        with ps._data_plane._lock:
            return len(ps._data_plane._channels)

    open_before = served()
    channel = open_channel(ps)
    assert channel.transport == "shm" and served() == open_before + 1
    channel.close()
    deadline = time.monotonic() + 5
    while served() > open_before:
        assert time.monotonic() < deadline, "the ps task kept serving a channel whose client left"
        time.sleep(0.02)
    assert len(ps.data_plane_failures) == before  # leaving between requests is no failure


def test_a_client_that_cannot_open_the_segment_stays_on_tcp(servers, monkeypatch):
    """Shared memory that fails (here: the client cannot open the segment) costs speed, never
    the connection: the client reconnects over tcp and stops offering; the task logs the
    abandoned segment and keeps serving."""
    ps = servers[0]
    before = len(ps.data_plane_failures)
    real = Channel.use_shared_memory

    def fail_to_open(self, name, token, create, timeout):
        if not create:
            raise CollectiveError(f"cannot open {name} (test)")
        return real(self, name, token, create, timeout)

    monkeypatch.setattr(Channel, "use_shared_memory", fail_to_open)
    strategy = make_strategy(servers)
    with strategy.scope():
        v = Variable(np.arange(12, dtype=np.float32).reshape(6, 2), name="fallback")
    np.testing.assert_array_equal(v.numpy(), np.arange(12, dtype=np.float32).reshape(6, 2))
    pools = [p for p in strategy.extended.client._data._pools.values() if p is not None]
    assert pools and not any(p.shared_memory for p in pools)
    assert all(c.transport == "tcp" for p in pools for c in p.free)
    message = wait_for_failure(ps, before + 1)
    assert ps.task in message and "shared-memory segment" in message


def test_a_full_dev_shm_keeps_channels_on_tcp_without_waiting(servers, monkeypatch, caplog):
    """A ps task whose /dev/shm cannot hold another segment declines the offer at once, so the
    client neither waits for a segment that will not come nor fails: it stays on tcp, and the
    task says why."""
    from pycollective.strategies.parameter_server import data_plane

    real = os.statvfs

    def full(path):
        stat = real(path)
        if path != "/dev/shm":
            return stat
        return os.statvfs_result((*stat[:4], 0, *stat[5:]))  # f_bavail = 0

    monkeypatch.setattr(data_plane.os, "statvfs", full)
    start = time.monotonic()
    channel = open_channel(servers[1])
    assert channel.transport == "tcp"
    # Declined in the reply: far below the setup's 10 s wait.
    assert time.monotonic() - start < 5.0
    assert "/dev/shm has 0 MiB free" in caplog.text
    channel.close()
