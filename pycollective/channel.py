"""Point-to-point data channels between two processes that are not one process group.

A process group links every rank to every other at start-up. Some programs need a native link
between two processes that meet later and come and go: a parameter-server task and each worker
(or coordinator) that talks to it. A :class:`Channel` is that: one native TCP link (the same
``_C.tcp_link`` a process group uses, authenticated with the cluster token by the same handshake,
pycollective/transports.py) inside a communicator of two ranks, and messages moved with the
native send/recv (csrc/algorithms/pairwise.cc) straight from the sender's array into the
receiver's. Every message carries a frame header that the receiver checks (sequence number,
byte count, tag): a message of another size or tag fails with a ProtocolError naming both ends
instead of landing in the wrong buffer, and a peer that dies mid-message fails the receive.

- :class:`ChannelListener` (the serving side, rank 0) listens on a port and hands out one
  Channel per authenticated connection;
- :func:`connect` (the dialing side, rank 1) opens one.

A channel moves one message at a time in each direction, in order; callers that share one
serialize their use of it.

Two processes on one host may add shared memory to a channel
(:meth:`Channel.use_shared_memory`: the process group's ``_C.shm_link``, a segment only holders
of the cluster token may open) and send their bulk messages (``bulk=True``) through it: one
copy into a ring and one out of it, no system call per piece, against two kernel copies and the
TCP stack on loopback. Small messages stay on the socket: they wake a server sleeping in
:meth:`Channel.wait_readable`, and a waiter for a short reply sleeps in poll() instead of the
shared-memory wait's pauses.
"""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Any

import numpy as np

from pycollective import config, transports
from pycollective._calls import call_spec
from pycollective._ext import _C

_CODES = _C.enum_codes()
_SENDRECV = _CODES["collective_kind"]["send/recv"]
_UINT8 = _CODES["dtype"]["uint8"]
# One group per direction: each counts only its own messages, so the two directions never
# share sequence numbers (the receiver checks them).
_DIRECTIONS = (
    _C.Members(ranks=[0, 1], group_id=0x5043_0001),
    _C.Members(ranks=[0, 1], group_id=0x5043_0002),
)


def _bytes_of(array: np.ndarray, where: str) -> np.ndarray:
    if not array.flags.c_contiguous:
        raise ValueError(f"{where}: a channel moves C-contiguous arrays, got a strided one")
    return array.reshape(-1).view(np.uint8)


class Channel:
    """One end of a native point-to-point link between two processes.

    Args:
        link: the native link to the other end (it owns the socket).
        rank: 0 on the accepting side, 1 on the dialing side.
        peer_name: who is at the other end, for error messages.
        timeout: seconds a send or receive may take before it fails.
    """

    def __init__(
        self, link: Any, rank: int, peer_name: str, timeout: float, fileno: int = -1
    ) -> None:
        self._fileno = fileno
        links = [None, link] if rank == 0 else [link, None]
        self._comm = _C.Communicator(
            rank=rank, size=2, links=links, host_of=[0, 1], timeout=timeout
        )
        # Bulk messages: the communicator over a shared-memory link once use_shared_memory
        # added one, else the socket's.
        self._bulk_comm = self._comm
        self.rank = rank
        self.peer_name = peer_name
        self.timeout = float(timeout)
        #: where bulk messages travel: "tcp", or "shm" once :meth:`use_shared_memory` ran
        self.transport = "tcp"
        self._out = _DIRECTIONS[rank]
        self._in = _DIRECTIONS[1 - rank]

    def use_shared_memory(self, name: str, token: str, create: bool, timeout: float) -> None:
        """From now on, bulk messages travel through the shared-memory segment ``name`` (a
        fresh, unguessable ``/...`` name). Both ends call it at the same point of their
        conversation, the server with ``create=True`` (it blocks until the client attached, at
        most ``timeout`` s); the segment is authenticated with the cluster ``token`` and
        unlinked once both attached. The ring size is ``PYCOLLECTIVE_SHM_RING_BYTES`` (the
        creator's)."""
        link = _C.shm_link(
            name=name,
            create=create,
            rank=self.rank,
            peer=1 - self.rank,
            digest=transports.shm_digest(token, name),
            ring_bytes=config.env_int("PYCOLLECTIVE_SHM_RING_BYTES", 4 << 20),
            timeout=timeout,
        )
        links = [None, link] if self.rank == 0 else [link, None]
        self._bulk_comm = _C.Communicator(
            rank=self.rank, size=2, links=links, host_of=[0, 0], timeout=self.timeout
        )
        self.transport = "shm"

    def send(
        self, array: np.ndarray, tag: int = 0, timeout: float | None = None, bulk: bool = False
    ) -> None:
        """Sends the bytes of a C-contiguous array; the receiver must call :meth:`recv` with
        an array of the same byte size, the same ``tag`` and the same ``bulk``. Empty arrays
        send nothing. ``bulk``: a large payload, sent through shared memory when the channel
        has it (never the first message of a request: that one must wake the server)."""
        self._move(_bytes_of(array, "Channel.send"), True, tag, timeout, bulk)

    def recv(
        self, out: np.ndarray, tag: int = 0, timeout: float | None = None, bulk: bool = False
    ) -> None:
        """Receives one message into ``out`` (C-contiguous, writable, exactly the message's
        byte size). Empty arrays receive nothing. ``bulk`` as the sender's."""
        if not out.flags.writeable:
            raise ValueError("Channel.recv: the output array is read-only")
        self._move(_bytes_of(out, "Channel.recv"), False, tag, timeout, bulk)

    def _move(
        self, data: np.ndarray, sending: bool, tag: int, timeout: float | None, bulk: bool
    ) -> None:
        """One native send/recv in this direction's group; the tag travels in the frame
        header's shape hash, which the receiver checks."""
        if data.size == 0:
            return
        spec = call_spec(
            _SENDRECV,
            data.size,
            _UINT8,
            0,
            self.rank if sending else 1 - self.rank,  # the sender's group rank
            "auto",
            tag & 0xFFFFFFFF,
            self.timeout if timeout is None else timeout,
        )
        buffers: list = [None, None]
        buffers[1 - self.rank] = data
        none: list = [None, None]
        (self._bulk_comm if bulk else self._comm).exchange(
            spec,
            self._out if sending else self._in,
            sends=buffers if sending else none,
            recvs=none if sending else buffers,
            asynchronous=False,
        )

    def wait_readable(self, timeout: float) -> bool:
        """Whether a message started arriving within ``timeout`` s: a server waits here for
        the next request of an idle client without holding a core (a receive would spin)."""
        if self._fileno < 0:
            return True
        # poll, not select: select refuses descriptors from FD_SETSIZE (1024) up, which a
        # server holding many connections and shared arrays reaches.
        poller = select.poll()
        poller.register(self._fileno, select.POLLIN)
        try:
            ready = poller.poll(max(0.0, timeout) * 1000.0)
        except OSError:
            return True  # closed: the receive reports why
        return bool(ready)

    def peer_closed(self) -> bool:
        """Whether the other end closed the connection cleanly, between messages (call it once
        :meth:`wait_readable` said something arrived): a server tells a client that left from
        one that broke off in the middle of a message."""
        if self._fileno < 0 or self.closed:
            return False
        try:
            with socket.fromfd(self._fileno, socket.AF_INET, socket.SOCK_STREAM) as sock:
                return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self, reason: str = "the channel was closed") -> None:
        """Fails anything pending on this channel, here and at the other end."""
        for comm in {id(c): c for c in (self._comm, self._bulk_comm)}.values():
            if not comm.aborted:
                comm.abort(reason)

    @property
    def closed(self) -> bool:
        return bool(self._comm.aborted or self._bulk_comm.aborted)

    def __repr__(self) -> str:
        closed = " (closed)" if self.closed else ""
        return f"<Channel rank {self.rank} to {self.peer_name} over {self.transport}{closed}>"


def host_identity() -> str:
    """Names this host for deciding whether two processes may share memory: the host id
    (``PYCOLLECTIVE_HOST_ID``, else the host name), the kernel's boot id and the identity of
    ``/dev/shm`` (processes in containers with separate ``/dev/shm`` differ)."""
    host = config.text("PYCOLLECTIVE_HOST_ID") or socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        shm = os.stat("/dev/shm")
    except OSError:
        return ""  # no way to tell: never share memory
    return f"{host}|{boot}|{shm.st_dev}:{shm.st_ino}"


def shared_memory_allowed() -> bool:
    """Whether channels may move onto shared memory: not when ``PYCOLLECTIVE_TRANSPORT``
    forces tcp (or grpc) for every link."""
    return config.text("PYCOLLECTIVE_TRANSPORT") in ("", "shm") and bool(host_identity())


class ChannelListener:
    """Accepts authenticated channels on ``host`` (an OS-chosen port: see ``port``).

    Args:
        token: the cluster token both ends share.
        session: a label both ends agree on (part of the handshake's MAC), e.g. the service
            and task the channel belongs to.
        host: the address to listen on (the one peers dial: pycollective.rendezvous.addresses
            server_host; "0.0.0.0" only when every interface is meant).
        timeout: the ``timeout`` of the channels it hands out.
    """

    def __init__(self, token: str, session: str, host: str, timeout: float = 60.0) -> None:
        self._token = token
        self._timeout = float(timeout)
        self._session = session.encode()
        self._mode = transports.data_mode()  # encrypted with PYCOLLECTIVE_DATA_ENCRYPT=1
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]

    def accept(self, timeout: float, handshake_timeout: float = 5.0) -> Channel | None:
        """The next authenticated channel, or None when none arrived within ``timeout`` s.
        Connections that fail the handshake (wrong token, stray clients) are closed and
        raise LinkSetupError; the listener stays usable."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock, addr = self._sock.accept()
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return None
        try:
            sock.settimeout(handshake_timeout)
            _, key = transports.admit(
                sock, addr, 0, self._token, self._session, lambda peer: peer == 1, self._mode
            )
            sock.settimeout(None)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, ConnectionError)):
                raise transports.LinkSetupError(
                    f"refused a channel connection from {addr}: {exc}"
                ) from exc
            raise
        name = f"{addr[0]}:{addr[1]}"
        fileno = sock.detach()
        link = _C.tcp_link(fd=fileno, rank=0, peer=1, address=name, key=key)
        return Channel(link, 0, name, self._timeout, fileno)

    def close(self) -> None:
        self._sock.close()


def connect(
    endpoint: str, token: str, session: str, timeout: float, peer_name: str | None = None
) -> Channel:
    """Opens a channel to the ChannelListener at ``endpoint`` (``host:port``); LinkSetupError
    when it cannot connect or the handshake fails within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    sock, key = transports.connect(
        1, 0, endpoint, token, session.encode(), deadline, transports.data_mode()
    )
    fileno = sock.detach()
    link = _C.tcp_link(fd=fileno, rank=1, peer=0, address=endpoint, key=key)
    return Channel(link, 1, peer_name or endpoint, timeout, fileno)


__all__ = ["Channel", "ChannelListener", "connect", "host_identity", "shared_memory_allowed"]
