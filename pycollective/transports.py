"""Opening the data links of a process group: which transport each peer gets, TCP connections
authenticated with the cluster token, and shared-memory segment names. The native side
(``_C.tcp_link`` / ``_C.shm_link``) then owns the socket or segment.

Transport per peer: ``shm`` between ranks on the same host, ``tcp`` otherwise;
``PYCOLLECTIVE_TRANSPORT`` (or ``transport=``) forces one for every peer, including the
portable ``grpc`` (pycollective/grpc_transport.py), which is never chosen automatically.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pycollective import config
from pycollective._ext import _C
from pycollective.errors import CollectiveError
from pycollective.rendezvous.addresses import (
    ALL_INTERFACES,
    dial_host,
    local_address_toward,
    server_host,
)

TRANSPORTS = ("shm", "tcp", "grpc")
_MAGIC = b"PCOLLINK"
_HELLO = struct.Struct("!8sI16sB")  # magic, connecting rank, nonce, encrypts (0/1)
_PLAIN, _ENCRYPTED = b"\x00", b"\x01"


class LinkSetupError(CollectiveError):
    """A data link could not be opened or authenticated."""


def choose_transport(my_host: str, peer_host: str, forced: str | None) -> str:
    if forced:
        if forced not in TRANSPORTS:
            raise ValueError(f"unknown transport {forced!r}; choose one of {', '.join(TRANSPORTS)}")
        if forced == "shm" and my_host != peer_host:
            raise ValueError(
                f"transport 'shm' needs every rank on one host, but host "
                f"{peer_host!r} is not {my_host!r}; use tcp"
            )
        return forced
    return "shm" if my_host == peer_host else "tcp"


def _mac(token: str, *parts: bytes) -> bytes:
    return hmac.new(token.encode(), b"|".join(parts), hashlib.sha256).digest()


def shm_digest(token: str, name: str) -> bytes:
    """What a shared-memory segment's creator stores and its opener must match: only holders
    of the cluster token attach to it."""
    return _mac(token, b"shm", name.encode())


def _data_key(token: str, session: bytes, nonce: bytes, peer_nonce: bytes) -> bytes:
    """The link's AES-256-GCM key: fresh for every connection (both nonces), known only to
    holders of the token."""
    return _mac(token, b"data-key", session, nonce, peer_nonce)


def _mode_name(mode: bytes) -> str:
    return "encrypts" if mode == _ENCRYPTED else "does not encrypt"


def encrypts_data() -> bool:
    """Whether this rank's tcp links are encrypted (PYCOLLECTIVE_DATA_ENCRYPT=1). Checks that
    libcrypto loads, so that a rank without it fails before any connection is made."""
    if not config.env_int("PYCOLLECTIVE_DATA_ENCRYPT", 0):
        return False
    _C.data_cipher_library()
    return True


def data_mode() -> bytes:
    """The handshake's mode byte for this process's data connections: encrypted when
    PYCOLLECTIVE_DATA_ENCRYPT=1 (every end of a connection must agree), else plaintext."""
    return _ENCRYPTED if encrypts_data() else _PLAIN


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed during the handshake")
        data += chunk
    return data


def bind_address(ifname: str | None, master_addr: str) -> str:
    """The address data listeners bind: PYCOLLECTIVE_IFNAME (an interface or an address;
    0.0.0.0 asks for all), else this host's address toward the coordinator (loopback for a
    single-host job). pycollective/rendezvous/addresses.py says why."""
    return server_host(master_addr, ifname)


def advertised_host(bind: str, master_addr: str) -> str:
    """The address peers should dial: the bound address, else (bound to all interfaces) the one
    that routes to the master."""
    if bind not in ALL_INTERFACES:
        return bind
    try:
        return local_address_toward(master_addr)
    except ValueError:
        return dial_host(bind)


@dataclass
class TcpListener:
    sock: socket.socket
    endpoint: str

    @classmethod
    def open(cls, ifname: str | None, master_addr: str) -> TcpListener:
        bind = bind_address(ifname, master_addr)
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((bind, 0))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise LinkSetupError(
                f"cannot listen for data links on {bind} ({exc}): set PYCOLLECTIVE_IFNAME to "
                "an interface or address of this host"
            ) from None
        port = sock.getsockname()[1]
        return cls(sock, f"{advertised_host(bind, master_addr)}:{port}")

    def close(self) -> None:
        self.sock.close()


def connect(
    rank: int,
    peer: int,
    endpoint: str,
    token: str,
    session: bytes,
    deadline: float,
    mode: bytes = _PLAIN,
) -> tuple[socket.socket, bytes]:
    """Dials ``endpoint`` (retrying until ``deadline``) and runs the dialing side of the
    handshake as ``rank``: both ends prove they know the cluster token for this ``session``
    and agree on ``mode`` (plaintext or encrypted). Returns the connected, authenticated socket
    (blocking) and the link's key (b"" when unencrypted); LinkSetupError otherwise."""
    host, port = endpoint.rsplit(":", 1)
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection(
                (host, int(port)), timeout=max(0.1, deadline - time.monotonic())
            )
            break
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    else:
        raise LinkSetupError(f"rank {rank} could not connect to rank {peer} at {endpoint}: {last}")
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        nonce = secrets.token_bytes(16)
        sock.sendall(_HELLO.pack(_MAGIC, rank, nonce, mode[0]))
        reply = _recv_exact(sock, 16 + 32 + 1)
        peer_nonce, peer_mac, peer_mode = reply[:16], reply[16:48], reply[48:]
        expected = _mac(token, b"accept", session, nonce, peer_nonce, peer_mode)
        if not hmac.compare_digest(peer_mac, expected):
            raise LinkSetupError(
                f"rank {peer} at {endpoint} did not prove it knows the cluster "
                "token: is PYCOLLECTIVE_TOKEN the same on every rank?"
            )
        if peer_mode != mode:
            raise LinkSetupError(
                f"rank {peer} {_mode_name(peer_mode)} its data links and rank {rank} "
                f"{_mode_name(mode)}: set PYCOLLECTIVE_DATA_ENCRYPT the same on every rank"
            )
        proof = _mac(token, b"connect", session, nonce, peer_nonce, str(rank).encode(), mode)
        sock.sendall(proof)
        if _recv_exact(sock, 1) != b"\x01":
            raise LinkSetupError(f"rank {peer} refused rank {rank}'s connection")
        sock.settimeout(None)
        key = _data_key(token, session, nonce, peer_nonce) if mode == _ENCRYPTED else b""
        return sock, key
    except (OSError, ConnectionError) as exc:
        sock.close()
        raise LinkSetupError(
            f"rank {rank}: handshake with rank {peer} at {endpoint} failed: {exc}"
        ) from exc
    except BaseException:
        sock.close()
        raise


def admit(
    sock: socket.socket,
    addr: object,
    rank: int,
    token: str,
    session: bytes,
    allowed: Callable[[int], bool],
    mode: bytes = _PLAIN,
) -> tuple[int, bytes]:
    """The accepting side of the handshake on a fresh connection, as ``rank``: the peer proves
    it knows the cluster token (and so does this side) for this ``session``, and both agree on
    ``mode``. Returns the rank the peer claims, once ``allowed(rank)`` accepted it, and the
    link's key (b"" when unencrypted); raises LinkSetupError (or OSError) otherwise. The caller
    sets the socket's timeout and closes it on failure."""
    magic, peer, nonce, peer_mode_byte = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
    if magic != _MAGIC or not allowed(peer):
        raise LinkSetupError(f"unexpected hello from {addr} (rank {peer})")
    peer_mode = bytes([peer_mode_byte])
    my_nonce = secrets.token_bytes(16)
    sock.sendall(my_nonce + _mac(token, b"accept", session, nonce, my_nonce, mode) + mode)
    if peer_mode != mode:  # the dialing rank says why, to its user
        raise LinkSetupError(
            f"rank {peer} {_mode_name(peer_mode)} its data links and rank {rank} "
            f"{_mode_name(mode)}: set PYCOLLECTIVE_DATA_ENCRYPT the same on every rank"
        )
    proof = _recv_exact(sock, 32)
    expected_proof = _mac(
        token, b"connect", session, nonce, my_nonce, str(peer).encode(), peer_mode
    )
    if not hmac.compare_digest(proof, expected_proof):
        raise LinkSetupError(
            f"connection from {addr} claiming rank {peer} has the wrong cluster token"
        )
    sock.sendall(b"\x01")
    key = _data_key(token, session, nonce, my_nonce) if mode == _ENCRYPTED else b""
    return peer, key


def _accept(
    listener: TcpListener,
    rank: int,
    expected: set[int],
    token: str,
    session: bytes,
    deadline: float,
    out: dict[int, tuple[socket.socket, bytes]],
    errors: list[str],
    mode: bytes,
) -> None:
    """Accepts authenticated connections from every rank in `expected` (each with its link's
    key, b"" when unencrypted). A connection that fails the handshake (wrong token, stray
    client, other encryption setting) is closed and logged; accepting goes on."""
    listener.sock.settimeout(0.2)
    while expected - set(out) and time.monotonic() < deadline:
        try:
            sock, addr = listener.sock.accept()
        except TimeoutError:
            continue
        except OSError as exc:
            errors.append(str(exc))
            return
        try:
            sock.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
            peer, key = admit(
                sock, addr, rank, token, session, lambda p: p in expected and p not in out, mode
            )
            sock.settimeout(None)
            out[peer] = (sock, key)
        except (OSError, ConnectionError, struct.error, LinkSetupError) as exc:
            errors.append(f"refused a data connection from {addr}: {exc}")
            sock.close()


def open_links(
    rank: int,
    size: int,
    hosts: list[str],
    endpoints: list[dict[str, str]],
    listener: TcpListener,
    token: str,
    session: str,
    forced: str | None,
    timeout: float,
    shm_ring_bytes: int,
    grpc_plane=None,
) -> tuple[list, list[str]]:
    """Opens one link per peer. Lower ranks accept TCP connections from higher ranks (in a
    thread) while this rank dials the lower ones; shared-memory pairs are set up in (lo, hi)
    order on every rank, so no two ranks wait for each other in opposite order.

    Returns the native links (None at this rank) and the transport name per peer."""
    deadline = time.monotonic() + timeout
    kinds = [
        choose_transport(hosts[rank], hosts[p], forced) if p != rank else "self"
        for p in range(size)
    ]
    sess = session.encode()
    higher_tcp = {p for p in range(rank + 1, size) if kinds[p] == "tcp"}
    mode = data_mode() if "tcp" in kinds else _PLAIN
    accepted: dict[int, tuple[socket.socket, bytes]] = {}
    errors: list[str] = []
    acceptor = threading.Thread(
        target=_accept,
        args=(listener, rank, higher_tcp, token, sess, deadline, accepted, errors, mode),
        daemon=True,
    )
    acceptor.start()
    links: list = [None] * size
    try:
        for p in range(size):
            if p == rank:
                continue
            if kinds[p] == "grpc":
                links[p] = grpc_plane.link(p, endpoints[p]["grpc"])
            elif kinds[p] == "tcp" and p < rank:
                sock, key = connect(rank, p, endpoints[p]["tcp"], token, sess, deadline, mode)
                links[p] = _C.tcp_link(
                    fd=sock.detach(), rank=rank, peer=p, address=endpoints[p]["tcp"], key=key
                )
            elif kinds[p] == "shm":
                lo, hi = min(rank, p), max(rank, p)
                name = f"/pycol-{session[:16]}-{lo}-{hi}"
                digest = shm_digest(token, name)
                links[p] = _C.shm_link(
                    name=name,
                    create=rank == lo,
                    rank=rank,
                    peer=p,
                    digest=digest,
                    ring_bytes=shm_ring_bytes,
                    timeout=max(0.1, deadline - time.monotonic()),
                )
        acceptor.join(max(0.0, deadline - time.monotonic()))
        missing = sorted(higher_tcp - set(accepted))
        if missing:
            detail = "; ".join(errors[-3:])
            raise LinkSetupError(
                f"rank {rank}: ranks {missing} did not connect within "
                f"{timeout:.0f} s" + (f" ({detail})" if detail else "")
            )
        for p, (sock, key) in accepted.items():
            links[p] = _C.tcp_link(
                fd=sock.detach(), rank=rank, peer=p, address=endpoints[p]["tcp"], key=key
            )
    except BaseException:
        for sock, _ in accepted.values():
            try:
                sock.close()
            except OSError:
                pass
        raise
    return links, kinds


def default_piece_bytes(ranks: int) -> int:
    """``staged``'s piece, bytes per rank, where ``PYCOLLECTIVE_HOST_PIECE_BYTES`` is unset: 1
    MiB for a host of 2 ranks, whose allreduces of 32-256 MiB ran 1.05x-1.1x faster with half as
    many segment calls as with 512 KiB (and tied at 256 KiB-16 MiB), 512 KiB for more, where 1
    MiB changed nothing beyond the noise (docs/benchmarks-log.md, thirty-sixth session)."""
    return (1 << 20) if ranks == 2 else (512 << 10)


def connect_host_segment(
    comm, rank: int, kinds: list[str], session: str, token: str, timeout: float
) -> None:
    """Gives the communicator the segment this rank shares with every rank it reaches over shm
    (its host's), for small collectives of exactly those ranks (algo ``slots``) and their large
    allreduces, reduce-scatters and allgathers, piece by piece (algo ``staged``). None is made for a rank alone on its host,
    when links are forced to another transport (the user asked for that path), or with
    ``PYCOLLECTIVE_HOST_SEGMENT=0``.

    Every rank of the host calls this at the same point of init; the lowest creates the
    segment, named after the session and that rank (unique even when pretend hosts share one
    machine's /dev/shm)."""
    ranks = [p for p, kind in enumerate(kinds) if kind == "shm" or p == rank]
    if len(ranks) < 2 or not config.env_int("PYCOLLECTIVE_HOST_SEGMENT", 1):
        return
    name = f"/pycol-{session[:16]}-h{ranks[0]}"
    comm.connect_host_segment(
        name=name,
        ranks=ranks,
        digest=shm_digest(token, name),
        # One slot serves both: small calls whole (slots) and large ones in pieces (staged).
        slot_bytes=max(
            config.env_int("PYCOLLECTIVE_HOST_SLOT_BYTES", 16 << 10),
            config.env_int("PYCOLLECTIVE_HOST_PIECE_BYTES", default_piece_bytes(len(ranks))),
        ),
        timeout=timeout,
    )
