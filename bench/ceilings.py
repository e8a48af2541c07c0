"""The machine's limits, measured in the same run as the collectives they bound."""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time


def memory_copy_bandwidth(nbytes: int, threads: int) -> float:
    """Bytes read + written per second by `threads` threads each copying its own buffer."""
    import pycollective as pc

    return pc._C.memory_bandwidth(bytes_per_thread=nbytes, threads=threads, reps=3)


def two_cpus() -> tuple[int, int] | None:
    """The first two CPUs this process may run on (None with one)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def cache_line_round_trip_ns(cpu_a: int, cpu_b: int) -> float | None:
    """Nanoseconds a cache line takes from one CPU to the other and back: how far apart they sit
    (the pace of every hand-over between cores through shared memory). None if either CPU
    cannot be used."""
    import pycollective as pc

    ns = pc._C.cache_line_round_trip_ns(cpu_a, cpu_b)
    return ns if ns > 0 else None


def loopback_tcp_bandwidth(nbytes: int = 256 << 20, chunk: int = 4 << 20, span: int = 0) -> float:
    """One TCP stream over loopback, bytes per second (what a single tcp link can carry).

    The sender sends `chunk` bytes at a time from, and the receiver receives them into, buffers
    of `span` bytes (`chunk` when 0), going round them. Over loopback the kernel copies every
    byte out of the sender's buffer and into the receiver's: with 4 MiB buffers both copies stay
    in cache, and past the cache (span = a large collective's message) one stream moved about
    half as much on the 2-vCPU VM (docs/benchmarks-log.md, "TCP from and into large buffers")."""
    span = max(span, chunk)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = [0]
    # Both written first: a never-written buffer reads as the kernel's one zero page, in cache.
    payload = memoryview(bytearray(b"\1" * span))

    def sink() -> None:
        conn, _ = server.accept()
        view = memoryview(bytearray(b"\0" * span))
        with conn:
            while received[0] < nbytes:
                at = received[0] % span
                n = conn.recv_into(view[at : at + min(chunk, span - at)])
                if n == 0:
                    break
                received[0] += n

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    with socket.create_connection(server.getsockname()) as c:
        start = time.perf_counter()
        sent = 0
        while sent < nbytes:
            at = sent % span
            c.sendall(payload[at : at + min(chunk, span - at, nbytes - sent)])
            sent += min(chunk, span - at, nbytes - sent)
        t.join(60)
        elapsed = time.perf_counter() - start
    server.close()
    return received[0] / elapsed if elapsed > 0 else 0.0


def loopback_tcp_exchange_bandwidth(nbytes: int = 128 << 20, chunk: int = 4 << 20) -> float:
    """Two endpoints over one loopback TCP connection, each sending `nbytes` while it receives
    as many, as every rank of a ring all-reduce does: bytes per second each way. Over loopback
    the kernel copies every byte on both sides, so on a host with as many cores as endpoints
    this is a fraction of one stream's rate; a tcp all-reduce's busbw can reach this one."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    start = threading.Barrier(2)
    began: list[float] = []  # after the barrier: the buffers are made before it
    finished: list[float] = []

    def endpoint(conn: socket.socket) -> None:
        conn.setblocking(False)
        payload = memoryview(bytes(chunk))
        inbox = memoryview(bytearray(chunk))
        sent = received = 0
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            start.wait()
            began.append(time.perf_counter())
            while received < nbytes or sent < nbytes:
                reading = selectors.EVENT_READ if received < nbytes else 0
                sel.modify(conn, reading | (selectors.EVENT_WRITE if sent < nbytes else 0))
                for _, ready in sel.select(timeout=60):
                    if ready & selectors.EVENT_WRITE:
                        try:
                            sent += conn.send(payload[: min(chunk, nbytes - sent)])
                        except BlockingIOError:
                            pass
                    if ready & selectors.EVENT_READ:
                        try:
                            n = conn.recv_into(inbox)
                        except BlockingIOError:
                            continue
                        if n == 0:
                            return
                        received += n
        finished.append(time.perf_counter())

    threads = [threading.Thread(target=endpoint, args=(c,), daemon=True) for c in (client, peer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    client.close()
    peer.close()
    if len(finished) != 2:
        return 0.0
    return nbytes / (max(finished) - min(began))
