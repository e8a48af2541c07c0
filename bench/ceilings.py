"""The machine's limits, measured in the same run as the collectives they bound."""

from __future__ import annotations

import socket
import threading
import time


def memory_copy_bandwidth(nbytes: int, threads: int) -> float:
    """Bytes read + written per second by `threads` threads each copying its own buffer."""
    import pycollective as pc

    return pc._C.memory_bandwidth(bytes_per_thread=nbytes, threads=threads, reps=3)


def loopback_tcp_bandwidth(nbytes: int = 256 << 20, chunk: int = 4 << 20) -> float:
    """One TCP stream over loopback, bytes per second (what a single tcp link can carry)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = [0]

    def sink() -> None:
        conn, _ = server.accept()
        buf = bytearray(chunk)
        view = memoryview(buf)
        with conn:
            while received[0] < nbytes:
                n = conn.recv_into(view)
                if n == 0:
                    break
                received[0] += n

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    payload = bytes(chunk)
    with socket.create_connection(server.getsockname()) as c:
        start = time.perf_counter()
        sent = 0
        while sent < nbytes:
            c.sendall(payload)
            sent += chunk
        t.join(60)
        elapsed = time.perf_counter() - start
    server.close()
    return received[0] / elapsed if elapsed > 0 else 0.0
