"""The parameter servers' native data plane (strategies/parameter_server/data_plane.py): tensor
bytes over authenticated native channels, one exchange per step, and what the ps task does with
bad input.

Covers: asynchronous updates from 8 workers applied exactly once (counted); a function sees
every write that finished before it was scheduled, whichever worker runs it (the values workers
keep between functions are never stale past that); corrupt, truncated and unauthenticated
frames are refused with an error naming the ps task while the task keeps serving; a refused
request names the task and leaves its channel usable; a pull whose reader stalls delays no update
and still gets the values of the moment it started."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from pycollective import transports
from pycollective._ext import _C
from pycollective.channel import Channel
from pycollective.strategies import (
    SGD,
    ClusterCoordinator,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    Server,
    SimpleClusterResolver,
    Variable,
)
from pycollective.strategies.parameter_server import ps_pb2 as pb
from pycollective.strategies.parameter_server.client import PSCall, PSClient, PullEntry
from pycollective.strategies.parameter_server.data_plane import session
from pycollective.strategies.parameter_server.framing import (
    BLOCK,
    receive_header,
    receive_tensors,
    send_message,
)

pytestmark = pytest.mark.timeout(120)

TOKEN = "data-plane-token"
WORKERS = 8


@pytest.fixture(scope="module")
def servers():
    """2 ps and 8 worker tasks in this process."""
    placeholder = {"ps": ["127.0.0.1:0"] * 2, "worker": ["127.0.0.1:0"] * WORKERS}
    tasks = [Server(placeholder, "ps", i, token=TOKEN) for i in range(2)] + [
        Server(placeholder, "worker", i, token=TOKEN) for i in range(WORKERS)
    ]
    yield tasks
    for s in tasks:
        s.stop(0)


def make_strategy(servers, workers=WORKERS, **kwargs):
    cluster = {
        "chief": ["127.0.0.1:1"],
        "ps": [s.address for s in servers[:2]],
        "worker": [s.address for s in servers[2 : 2 + workers]],
    }
    kwargs.setdefault("rpc_timeout", 20)
    return ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0), token=TOKEN, **kwargs
    )


def count_step(counter, total, optimizer):
    """Reads both variables (so the read path and kept values are exercised) and adds one to
    every element through the optimizer (SGD, lr 1, gradient -1)."""
    seen = np.asarray(counter).copy()
    optimizer.apply_gradients(
        [(-np.ones(counter.shape, np.float32), counter), (-np.ones(1, np.float32), total)]
    )
    return seen


def test_async_updates_from_8_workers_are_applied_exactly_once(servers):
    strategy = make_strategy(servers, variable_partitioner=FixedShardsPartitioner(2))
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        counter = Variable(np.zeros((6, 3), np.float32), name="counter")  # 2 shards, 2 tasks
        total = Variable(np.zeros(1, np.float32), name="total")
        opt = SGD(1.0)
    steps = 400
    results = [coordinator.schedule(count_step, args=(counter, total, opt)) for _ in range(steps)]
    coordinator.join()
    seen = np.array([r.fetch()[0, 0] for r in results])
    np.testing.assert_array_equal(counter.numpy(), np.full((6, 3), steps, np.float32))
    np.testing.assert_array_equal(total.numpy(), [steps])
    assert int(opt.iterations.numpy()) == steps
    # Every step read a value some prefix of the updates produced: never beyond the total.
    assert seen.min() >= 0 and seen.max() <= steps - 1
    coordinator.close()


def read_value(var):
    return np.asarray(var).copy()


def push_one(var, optimizer):
    """A training step: reads the variable, then pushes (the push returns the new values, which
    the worker keeps for its next function)."""
    before = np.asarray(var).copy()
    optimizer.apply_gradients([(-np.ones(var.shape, np.float32), var)])
    after = np.asarray(var).copy()
    assert after[0] >= before[0] + 1
    return after


def test_a_function_sees_every_write_finished_before_it_was_scheduled(servers):
    strategy = make_strategy(servers, workers=4)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros(5, np.float32), name="v")
        opt = SGD(1.0)
    expected = 0.0
    for round_ in range(12):
        # Pushes finish on some workers (each keeps the values its push returned) ...
        for _ in range(3):
            expected += 1
            after = coordinator.schedule(push_one, args=(v, opt)).fetch()
            assert after[0] >= expected  # its own update is in what the push returned
        # ... then every worker reads: none may see values older than the last finished push.
        reads = [coordinator.schedule(read_value, args=(v,)) for _ in range(8)]
        for r in reads:
            np.testing.assert_array_equal(r.fetch(), np.full(5, expected, np.float32))
        # The coordinator's own writes count too.
        if round_ % 4 == 3:
            v.assign(np.full(5, 100.0 * round_, np.float32))
            expected = 100.0 * round_
            for r in [coordinator.schedule(read_value, args=(v,)) for _ in range(8)]:
                np.testing.assert_array_equal(r.fetch(), np.full(5, expected, np.float32))
    coordinator.close()


# Bad input on the data plane ---------------------------------------------------------------------


def lead_frame_bytes(request: pb.DataRequest) -> bytes:
    """The exact bytes a client's channel sends for ``request``'s lead frame (frame header and
    payload), captured from a channel over a socket pair."""
    mine, theirs = socket.socketpair()
    channel = Channel(
        _C.tcp_link(fd=mine.detach(), rank=1, peer=0, address="socketpair"), 1, "capture", 5.0
    )
    send_message(channel, np.empty(BLOCK, np.uint8), request, [])
    theirs.settimeout(5)
    data = b""
    while len(data) < BLOCK + 48:
        data += theirs.recv(1 << 16)
    channel.close()
    theirs.close()
    return data


def raw_connection(server: Server, token: str = TOKEN) -> socket.socket:
    """A TCP connection to the ps task's data plane that passed the channel handshake."""
    host = server.address.rpartition(":")[0]
    port = server._data_plane.port
    sock, _ = transports.connect(
        1,
        0,
        f"{host}:{port}",
        token,
        session(server.task).encode(),
        time.monotonic() + 5,
    )
    return sock


def wait_for_failure(server: Server, count: int) -> str:
    deadline = time.monotonic() + 10
    while len(server.data_plane_failures) < count:
        assert time.monotonic() < deadline, "the ps task did not report the bad frame"
        time.sleep(0.02)
    return server.data_plane_failures[count - 1]


def still_serves(servers) -> None:
    strategy = make_strategy(servers, workers=1)
    with strategy.scope():
        w = Variable(np.arange(7, dtype=np.float32), name="probe")
    np.testing.assert_array_equal(w.numpy(), np.arange(7, dtype=np.float32))
    w.assign_add(np.ones(7, np.float32))
    np.testing.assert_array_equal(w.numpy(), np.arange(1, 8, dtype=np.float32))


def test_corrupt_and_truncated_frames_are_refused_and_the_task_keeps_serving(servers):
    ps = servers[0]
    before = len(ps.data_plane_failures)
    good = lead_frame_bytes(pb.DataRequest(pull=pb.PullRequest(keys=["nothing"])))

    # A frame header that is not the one the task expects (corrupt bytes).
    corrupt = bytearray(good)
    corrupt[8:16] = (12345).to_bytes(8, "little")  # the sequence number
    sock = raw_connection(ps)
    sock.sendall(bytes(corrupt))
    message = wait_for_failure(ps, before + 1)
    assert ps.task in message and "closed that channel" in message
    sock.close()
    still_serves(servers)

    # A frame cut short: the client vanishes in the middle of its payload.
    sock = raw_connection(ps)
    sock.sendall(good[: len(good) // 2])
    sock.close()
    message = wait_for_failure(ps, before + 2)
    assert ps.task in message and "closed its connection" in message
    still_serves(servers)

    # A well-framed message whose header announces more than the task accepts.
    lying = bytearray(good)
    lying[48:52] = (1 << 31).to_bytes(4, "little")  # header length
    sock = raw_connection(ps)
    sock.sendall(bytes(lying))
    message = wait_for_failure(ps, before + 3)
    assert ps.task in message and "header" in message
    sock.close()
    still_serves(servers)


def test_a_connection_without_the_token_is_refused(servers):
    ps = servers[1]
    with pytest.raises(transports.LinkSetupError, match="did not prove it knows the cluster token"):
        raw_connection(ps, token="not-the-token")
    still_serves(servers)


def test_a_refused_request_names_the_task_and_the_channel_goes_on(servers):
    strategy = make_strategy(servers, workers=1)
    with strategy.scope():
        w = Variable(np.zeros(4, np.float32), name="refused")
    client = PSClient(TOKEN, 10)
    shard = w._shards[0]

    bad = PSCall(
        shard.address,
        shard.task,
        "Assign",
        pb.AssignRequest(keys=[shard.key], kind="assign"),
        arrays=[np.zeros(5, np.float32)],  # the variable holds 4
    )
    with pytest.raises(RuntimeError) as info:
        client.call_many([bad])
    assert f"/job:ps/replica:0/task:{shard.task}" in str(info.value)
    assert "shape" in str(info.value)
    good = PSCall(
        shard.address,
        shard.task,
        "Assign",
        pb.AssignRequest(keys=[shard.key], kind="assign"),
        arrays=[np.full(4, 3.0, np.float32)],
    )
    client.call_many([good])
    np.testing.assert_array_equal(w.numpy(), np.full(4, 3.0, np.float32))
    client.close()


def test_an_assignment_refused_for_one_key_changes_no_key(servers):
    """Every key of an assignment is checked before any changes: one refused for its second
    key leaves the first as it was, and the buffer received for the first does not stay
    behind as the variable while going back to the task's pool (where the next receive of its
    shape would write into the variable)."""
    ps = servers[0]
    task = ps.task_index
    client = PSClient(TOKEN, 10)

    def assign(keys, values, create=False):
        request = pb.AssignRequest(keys=keys, kind="assign", create=create, trainable=True)
        client.call_many([PSCall(ps.address, task, "Assign", request, arrays=values)])

    def read(key, n):
        return client.pull([(task, ps.address, [PullEntry(key, (n,), np.float32)])])[key]

    assign(["atomic_a", "atomic_b"], [np.zeros(4, np.float32), np.zeros(5, np.float32)], True)
    with pytest.raises(RuntimeError, match="atomic_b.*shape"):
        assign(["atomic_a", "atomic_b"], [np.full(4, 7.0, np.float32), np.zeros(6, np.float32)])
    np.testing.assert_array_equal(read("atomic_a", 4), np.zeros(4, np.float32))
    assign(["atomic_c"], [np.full(4, 9.0, np.float32)], True)  # a receive of atomic_a's shape
    np.testing.assert_array_equal(read("atomic_a", 4), np.zeros(4, np.float32))
    np.testing.assert_array_equal(read("atomic_c", 4), np.full(4, 9.0, np.float32))
    client.close()


def stalled_pull(server: Server, key: str) -> Channel:
    """A channel whose pull of ``key`` is under way but not read: the task's send stops once the
    socket's buffers are full."""
    sock = raw_connection(server)
    channel = Channel(
        _C.tcp_link(fd=sock.detach(), rank=1, peer=0, address=server.address), 1, "stalled", 30.0
    )
    send_message(
        channel, np.empty(BLOCK, np.uint8), pb.DataRequest(pull=pb.PullRequest(keys=[key])), []
    )
    return channel


def test_a_stalled_pull_delays_no_update_and_gets_the_values_it_started_with(servers):
    # Short RPCs: an update that waited for the stalled reader would fail in seconds.
    strategy = make_strategy(servers, workers=1, rpc_timeout=5)
    n = 8 << 20  # 32 MiB of float32: several times what a loopback socket buffers
    start = np.arange(n, dtype=np.float32) % 1000
    with strategy.scope():
        v = Variable(start, name="stalled")
        opt = SGD(1.0)
    shard = v._shards[0]
    ps = next(s for s in servers[:2] if s.address == shard.address)
    service = ps._data_plane._service

    def pinned() -> int:
        with service._cond:
            return sum(service._pins.values())

    def stall() -> Channel:
        """A pull of the variable, sending (its array pinned) but not read."""
        before = pinned()
        channel = stalled_pull(ps, shard.key)
        deadline = time.monotonic() + 10
        while pinned() == before:
            assert time.monotonic() < deadline, "the task did not start sending the pull"
            time.sleep(0.01)
        return channel

    channels = []
    try:
        # Each update meets the array a stalled pull sends from.
        channels.append(stall())
        v.assign_add(np.ones(n, np.float32))  # in place: the variable moves to a copy
        channels.append(stall())
        strategy.extended.push_gradients(opt, [(np.full(n, -2.0, np.float32), v)])  # SGD: +2
        channels.append(stall())
        v.assign(start * 2)  # the variable gets a new array
        # The next receive of that shape must not land in the array the last pull sends from.
        strategy.extended.push_gradients(opt, [(np.full(n, -1.0, np.float32), v)])
        np.testing.assert_array_equal(v.numpy(), start * 2 + 1)
        # Still sending: the updates did not wait for them (socket buffers smaller than 32 MiB).
        assert pinned() == 3
        # Each stalled pull, read now, holds the values of its moment.
        for channel, expected in zip(channels, (start, start + 1, start + 3)):
            block = np.empty(BLOCK, np.uint8)
            reply, inline = receive_header(channel, block, pb.DataReply, 30)
            assert not reply.error, reply.error
            got = np.empty(n, np.float32)
            receive_tensors(channel, inline, [got], 30)
            np.testing.assert_array_equal(got, expected)
    finally:
        for channel in channels:
            channel.close()
    # Read to the end, the pulls let go of their arrays, and the arrays the variable moved off
    # went back to the task's pool.
    deadline = time.monotonic() + 10
    while service._pins or service._retired:
        assert time.monotonic() < deadline, (service._pins, service._retired)
        time.sleep(0.01)
    v.assign_add(np.ones(n, np.float32))
    np.testing.assert_array_equal(v.numpy(), start * 2 + 2)
