"""pycollective/_ports.py: a reserved port is the OS's choice, nobody else's while it is held,
and still open to the listener it was reserved for (gRPC as the coordinator and ps tasks bind
it, with and without grpc.so_reuseport)."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest

from pycollective._ports import PortReservation


@pytest.mark.timeout(30)
def test_a_held_port_is_refused_to_others_and_free_for_its_listener():
    with PortReservation(3) as reserved:
        assert len(set(reserved.ports)) == 3 and all(p > 0 for p in reserved.ports)
        port = reserved.ports[0]
        # Anyone else: a plain bind fails, and the OS never hands it out for port 0.
        other = socket.socket()
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        other.close()
        handed_out = []
        for _ in range(200):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                handed_out.append(s.getsockname()[1])
        assert not set(handed_out) & set(reserved.ports)
        # The listener it was reserved for binds it and serves (both gRPC socket settings).
        for reuseport in (0, 1):
            server = grpc.server(
                futures.ThreadPoolExecutor(1), options=[("grpc.so_reuseport", reuseport)]
            )
            assert server.add_insecure_port(f"127.0.0.1:{port}") == port
            server.start()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
            server.stop(0).wait()
    # Released: an ordinary bind takes it again.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
