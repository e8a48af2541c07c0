"""The tcp data listener accepts only ranks that prove they hold the cluster token: stray
connections (garbage, a replayed hello, a wrong token) are refused, logged, and do not stop the
real rank from connecting."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time

import pytest

from pycollective import transports as t


def _stray(endpoint: str, behaviour: str, session: bytes) -> None:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        if behaviour == "garbage":
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        elif behaviour == "wrong token":
            s.sendall(t._HELLO.pack(t._MAGIC, 1, b"n" * 16, 0))
            reply = t._recv_exact(s, 16 + 32 + 1)
            bad = hmac.new(b"guess", b"connect" + reply[:16], hashlib.sha256).digest()
            s.sendall(bad)
        elif behaviour == "replayed hello":
            s.sendall(t._HELLO.pack(t._MAGIC, 1, b"r" * 16, 0) * 2)
        try:
            s.recv(64)  # the listener closes: nothing more comes
        except OSError:
            pass


@pytest.mark.timeout(60)
def test_stray_connections_are_refused_and_the_rank_still_connects():
    token, session = "the-cluster-token", b"sess"
    listener = t.TcpListener.open(None, "127.0.0.1")
    accepted: dict = {}
    errors: list[str] = []
    deadline = time.monotonic() + 20
    acceptor = threading.Thread(
        target=t._accept,
        args=(listener, 0, {1}, token, session, deadline, accepted, errors, t._PLAIN),
    )
    acceptor.start()
    try:
        for behaviour in ("garbage", "wrong token", "replayed hello"):
            _stray(listener.endpoint, behaviour, session)
        assert accepted == {}, accepted
        sock, key = t.connect(1, 0, listener.endpoint, token, session, deadline, t._PLAIN)
        acceptor.join(10)
        assert set(accepted) == {1} and key == b""
        sock.close()
        for s, _ in accepted.values():
            s.close()
    finally:
        listener.close()
    assert len(errors) == 3, errors
    assert all("refused a data connection" in e for e in errors), errors
    assert any("wrong cluster token" in e for e in errors), errors


@pytest.mark.timeout(60)
def test_a_rank_with_the_wrong_token_does_not_connect():
    listener = t.TcpListener.open(None, "127.0.0.1")
    accepted: dict = {}
    errors: list[str] = []
    deadline = time.monotonic() + 5
    acceptor = threading.Thread(
        target=t._accept,
        args=(listener, 0, {1}, "right", b"s", deadline, accepted, errors, t._PLAIN),
    )
    acceptor.start()
    try:
        with pytest.raises(t.LinkSetupError, match="cluster token"):
            t.connect(1, 0, listener.endpoint, "wrong", b"s", deadline, t._PLAIN)
        acceptor.join(10)
    finally:
        listener.close()
    assert accepted == {}
