"""The listening TCP sockets of a process, read from /proc (no psutil): which address each binds.

``Sampler`` polls them from a thread inside a rank, so that listeners that live only while a
group forms (the data listeners) are seen too."""

from __future__ import annotations

import ipaddress
import os
import threading

_LISTEN = "0A"


def _socket_inodes(pid: str) -> set[str]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> str:
    # /proc/net/tcp{,6} print each 32-bit word of the address in host (little-endian) order.
    words = [bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8)]
    address = ipaddress.ip_address(b"".join(words))
    # gRPC binds an IPv4 address on an IPv6 socket, as ::ffff:a.b.c.d: that is a.b.c.d only.
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def listening(pid: int | str = "self") -> set[tuple[str, int]]:
    """``(address, port)`` of every listening TCP socket the process holds."""
    inodes = _socket_inodes(str(pid))
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in inodes:
                addr, port = local.split(":")
                found.add((_address(addr), int(port, 16)))
    return found


class Sampler:
    """Records every listening socket of this process every ``interval`` seconds until
    ``stop()``."""

    def __init__(self, interval: float = 0.002) -> None:
        self.seen: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.seen |= listening()
            self._stop.wait(interval)

    def stop(self) -> set[tuple[str, int]]:
        self._stop.set()
        self._thread.join()
        self.seen |= listening()
        return self.seen
