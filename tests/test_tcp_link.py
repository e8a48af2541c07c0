"""TCP links between ranks on one host: their sockets use reno (csrc/transport/tcp.cc says why),
and a large all-reduce over them is exact."""

from __future__ import annotations

import socket

import numpy as np
from multiproc import run_ranks


def _congestion_controls() -> list[str]:
    """The congestion control of every connected TCP socket this process holds."""
    import os

    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # not a socket
        with s:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                s.getpeername()
            except OSError:
                continue  # a listener, or not connected
            cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
            found.append(cc.split(b"\0", 1)[0].decode())
    return found


def _link_sockets(rank, n):
    import pycollective as pc

    pc.init(transport="tcp")
    count = (4 << 20) + 3  # several socket buffers per direction, odd length
    x = (np.arange(count) % 7 + rank).astype(np.float32)
    y = pc.allreduce(x)
    want = sum((np.arange(count) % 7 + r).astype(np.float32) for r in range(n))
    assert np.array_equal(y, want), f"rank {rank}: the all-reduce over tcp differs from numpy"
    ccs = _congestion_controls()
    pc.shutdown()
    return ccs


def _system_default() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def test_same_host_tcp_links_use_reno():
    n = 3
    results = run_ranks(_link_sockets, n, timeout=120)
    default = _system_default()
    for rank, ccs in enumerate(results):
        # One link per peer, each over loopback: all reno. Sockets pycollective's links do not
        # own (the coordination service's) keep the system's default.
        assert ccs.count("reno") >= n - 1, (rank, ccs)
        if default != "reno":
            assert ccs.count("reno") == n - 1, (rank, ccs)
            assert ccs.count(default) == len(ccs) - (n - 1), (rank, ccs)
