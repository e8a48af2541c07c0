"""pycollective.channel: a channel with shared memory added (Channel.use_shared_memory) moves
bulk messages through the segment and the others over its socket.

Covers: bulk messages larger than the ring cross exact in both directions, interleaved with
socket messages; a bulk message received with another tag fails with a ProtocolError; a
segment opened with another token is refused."""

from __future__ import annotations

import secrets
import threading

import numpy as np
import pytest

from pycollective.channel import ChannelListener, connect, host_identity
from pycollective.errors import CollectiveError, ProtocolError

pytestmark = pytest.mark.timeout(60)

TOKEN = "channel-token"
SESSION = "test channel"


def channel_pair(client_token=TOKEN):
    """(server end, client end) of one channel, both with shared memory added (the client with
    ``client_token``; the server's error, if any, is raised here)."""
    listener = ChannelListener(TOKEN, SESSION, "127.0.0.1", timeout=10)
    accepted = {}
    thread = threading.Thread(target=lambda: accepted.update(ch=listener.accept(10)))
    thread.start()
    client = connect(f"127.0.0.1:{listener.port}", TOKEN, SESSION, 10)
    thread.join(10)
    server = accepted["ch"]
    listener.close()
    name = f"/pycol-test-{secrets.token_hex(8)}"
    errors = []

    def create():
        try:
            server.use_shared_memory(name, TOKEN, True, 5)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    creator = threading.Thread(target=create)
    creator.start()
    try:
        client.use_shared_memory(name, client_token, False, 5)
    finally:
        creator.join(10)
    if errors:
        raise errors[0]
    return server, client


def test_bulk_messages_cross_shared_memory_and_the_rest_the_socket():
    server, client = channel_pair()
    assert server.transport == client.transport == "shm"
    rng = np.random.default_rng(0)
    big = rng.standard_normal(3 << 20).astype(np.float32)  # 12 MiB: wraps the 4 MiB rings
    small = np.arange(100, dtype=np.int64)

    def serve():
        got = np.empty_like(small)
        server.recv(got, tag=1)
        data = np.empty_like(big)
        server.recv(data, tag=2, bulk=True)
        server.send(data * 2, tag=3, bulk=True)
        server.send(got + 1, tag=4)

    thread = threading.Thread(target=serve)
    thread.start()
    client.send(small, tag=1)
    client.send(big, tag=2, bulk=True)
    doubled = np.empty_like(big)
    client.recv(doubled, tag=3, bulk=True)
    plus_one = np.empty_like(small)
    client.recv(plus_one, tag=4)
    thread.join(10)
    np.testing.assert_array_equal(doubled, big * 2)
    np.testing.assert_array_equal(plus_one, small + 1)
    server.close()
    client.close()
    assert server.closed and client.closed


def test_a_bulk_message_with_another_tag_is_refused():
    server, client = channel_pair()
    thread = threading.Thread(target=lambda: client.send(np.ones(1000, np.float32), 7, bulk=True))
    thread.start()
    with pytest.raises(ProtocolError):
        server.recv(np.empty(1000, np.float32), tag=8, bulk=True)
    thread.join(10)
    server.close()
    client.close()


def test_a_segment_opened_with_another_token_is_refused():
    with pytest.raises(CollectiveError, match="authentication digest differs"):
        channel_pair(client_token="another token")


def test_the_host_identity_names_this_host():
    identity = host_identity()
    assert identity and identity == host_identity()
    assert "|" in identity  # host id, boot id and /dev/shm


def test_wait_readable_with_a_descriptor_above_select_limit():
    """A server with over a thousand descriptors open (connections, shared arrays) still waits
    for an idle client: select() refuses descriptors from 1024 up, poll() does not."""
    import os
    import resource
    import socket

    from pycollective import _C
    from pycollective.channel import Channel

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if max(soft, hard if hard != resource.RLIM_INFINITY else high + 1) <= high:
        pytest.skip(f"this process may not open descriptor {high} (RLIMIT_NOFILE {soft}/{hard})")
    if soft <= high:
        resource.setrlimit(resource.RLIMIT_NOFILE, (high + 1, hard))
    mine, theirs = socket.socketpair()
    try:
        os.dup2(mine.fileno(), high)
        mine.close()
        link = _C.tcp_link(fd=high, rank=1, peer=0, address="socketpair")
        channel = Channel(link, 1, "high descriptor", 5.0, high)
        assert not channel.wait_readable(0.05)  # nothing sent: it waits, it does not say ready
        theirs.send(b"x")
        assert channel.wait_readable(5.0)
        channel.close()
    finally:
        theirs.close()
        if soft <= high:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
