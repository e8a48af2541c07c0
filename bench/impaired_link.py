"""Packet loss and delay on namespace hosts' links where the kernel has no ``sch_netem``: a relay
in user space, between a host's veth and the cluster's bridge. Standard library only, like
bench/netns_cluster.py; root, as that is.

How one host's link is impaired (``ImpairedLinks(cluster, hosts, loss=..., delay_s=...)``):

- its bridge port (the veth end outside the namespace) leaves the bridge; a raw packet socket
  on that port now sees every frame the host sends, and sends the frames meant for it;
- a TAP device takes the port's place on the bridge;
- one thread relays frames both ways: from the host towards the bridge it drops each frame
  with probability ``loss`` and holds the rest ``delay_s`` before writing them to the TAP (the
  host's egress, where ``tc netem`` on its eth0 would act); from the bridge to the host it
  forwards at once. A packet between two impaired hosts is so dropped or delayed once, as with
  netem on every host's eth0.

Frames pass with their virtio-net header (PACKET_VNET_HDR on the socket, IFF_VNET_HDR on the
TAP), so a checksum the host's kernel left for the device to fill is completed on the other
side instead of arriving wrong. The host's eth0 is limited to one segment per frame
(``gso_max_segs 1``): each dropped frame is one packet, as with netem, not a 64 KiB burst.

Leaving the context restores the link: the TAP goes, the port rejoins the bridge, eth0's
segmentation limit is lifted. The relay drops frames only when told to; what it dropped and
forwarded is in ``counts``.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence

from .netns_cluster import ClusterError, NetnsCluster

_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI, _IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
_ETH_P_ALL = 0x0003
_SOL_PACKET, _PACKET_VNET_HDR = 263, 15
_FRAME_MAX = 65536 + 64  # a frame with its virtio-net header, offloads or not
_SOCKET_BUFFER = 8 << 20  # frames queue here while the relay thread waits for the GIL


def relay_missing() -> str:
    """ "" when this machine can run the relay (a TUN/TAP device), else why not."""
    if not os.path.exists("/dev/net/tun"):
        return (
            "loss and delay need sch_netem or /dev/net/tun (TUN/TAP), and this machine has neither"
        )
    return ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` said: {done.stderr.strip()}")


class _Link:
    """One host's relayed link: the packet socket on its port, the TAP on the bridge."""

    def __init__(self, cluster: NetnsCluster, host: int) -> None:
        self.cluster, self.host = cluster, host
        self.port = cluster.bridge_port(host)
        self.tap_name = f"pc{cluster.id}r{host}"
        self.socket: socket.socket | None = None
        self.tap: int = -1

    def open(self) -> None:
        c = self.cluster
        _ip(
            "netns",
            "exec",
            c.namespace(self.host),
            "ip",
            "link",
            "set",
            "eth0",
            "gso_max_segs",
            "1",
        )
        self.tap = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        flags = _IFF_TAP | _IFF_NO_PI | _IFF_VNET_HDR
        fcntl.ioctl(self.tap, _TUNSETIFF, struct.pack("16sH", self.tap_name.encode(), flags))
        self.socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        self.socket.setsockopt(_SOL_PACKET, _PACKET_VNET_HDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        self.socket.bind((self.port, 0))
        self.socket.setblocking(False)
        _ip("link", "set", self.port, "nomaster")
        _ip("link", "set", self.tap_name, "master", c.bridge, "up")

    def close(self) -> None:
        if self.tap >= 0:
            os.close(self.tap)  # a TAP without persistence goes with its last descriptor
            self.tap = -1
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        for args in (
            ["link", "set", self.port, "master", self.cluster.bridge],
            ["netns", "exec", self.cluster.namespace(self.host), "ip", "link", "set", "eth0"]
            + ["gso_max_segs", "65535"],
        ):
            subprocess.run(["ip", *args], capture_output=True, check=False)


class ImpairedLinks:
    """Loss and delay on the links of ``hosts`` of a built NetnsCluster, while in the context.

    Args:
        cluster: The cluster (entered: its namespaces and bridge exist).
        hosts: The hosts whose links are impaired.
        loss: Probability that a frame a host sends is dropped.
        delay_s: How long every frame a host sends is held before it goes on.
        seed: Seeds the drops, so a round can be repeated.
    """

    def __init__(
        self,
        cluster: NetnsCluster,
        hosts: Sequence[int],
        loss: float = 0.0,
        delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= loss < 1.0 or delay_s < 0.0:
            raise ValueError(f"loss must be in [0, 1) and delay >= 0, got {loss}, {delay_s}")
        self.loss, self.delay_s = loss, delay_s
        self._random = random.Random(seed)
        self._links = [_Link(cluster, h) for h in hosts]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.counts = {"dropped": 0, "delayed": 0, "to hosts": 0}

    def __enter__(self) -> ImpairedLinks:
        try:
            for link in self._links:
                link.open()
        except BaseException:
            self._close_links()
            raise
        self._thread = threading.Thread(target=self._relay, name="impaired-links", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._close_links()
        if self._error is not None:
            raise RuntimeError(f"the relay of the impaired links failed: {self._error!r}")

    def _close_links(self) -> None:
        for link in self._links:
            link.close()

    def _relay(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to __exit__, which raises it
            self._error = exc

    def _loop(self) -> None:
        by_fd: dict[int, tuple[_Link, bool]] = {}
        for link in self._links:
            assert link.socket is not None
            by_fd[link.socket.fileno()] = (link, True)  # frames the host sent
            by_fd[link.tap] = (link, False)  # frames on their way to the host
        held: list[tuple[float, int, int, bytes]] = []  # (due, order, tap, frame)
        order = 0
        while not self._stop.is_set():
            now = time.monotonic()
            while held and held[0][0] <= now:
                _, _, tap, frame = heapq.heappop(held)
                _write(tap, frame)
            wait = 0.05 if not held else max(0.0, held[0][0] - now)
            ready, _, _ = select.select(list(by_fd), [], [], wait)
            for fd in ready:
                link, from_host = by_fd[fd]
                for frame in _read_all(link, from_host):
                    if not from_host:
                        assert link.socket is not None
                        _send(link.socket, frame)
                        self.counts["to hosts"] += 1
                    elif self._random.random() < self.loss:
                        self.counts["dropped"] += 1
                    else:
                        self.counts["delayed"] += 1
                        order += 1
                        heapq.heappush(
                            held, (time.monotonic() + self.delay_s, order, link.tap, frame)
                        )


def _read_all(link: _Link, from_host: bool) -> list[bytes]:
    frames = []
    while True:
        try:
            if from_host:
                assert link.socket is not None
                frame, address = link.socket.recvfrom(_FRAME_MAX)
                if address[2] == socket.PACKET_OUTGOING:
                    continue  # the relay's own frames towards the host
            else:
                frame = os.read(link.tap, _FRAME_MAX)
        except (BlockingIOError, InterruptedError):
            return frames
        frames.append(frame)


def _write(tap: int, frame: bytes) -> None:
    try:
        os.write(tap, frame)
    except BlockingIOError:
        pass  # the bridge side is full: the frame is lost, as on a congested wire


def _send(sock: socket.socket, frame: bytes) -> None:
    try:
        sock.send(frame)
    except BlockingIOError:
        pass
