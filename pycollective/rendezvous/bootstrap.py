"""Forms a process group's control plane: rank 0 hosts the service, all ranks register."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from .addresses import dial_host, server_host
from .client import CoordinationClient, PeerInfo
from .cluster import ClusterSpec, format_address, parse_address
from .service import CoordinationService


def rendezvous(
    spec: ClusterSpec,
    endpoints: dict[str, str],
    timeout: float,
    heartbeat_timeout: float | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[CoordinationClient, list[PeerInfo], CoordinationService | None]:
    """Starts the coordinator on rank 0, then registers this rank and returns the peers.

    The client's heartbeat is not started: the caller starts it with the
    callback that aborts its communicator (``client.start_heartbeat``).

    Args:
        spec: This process's place in the group (see ``ClusterSpec.from_env``).
        endpoints: This rank's data-plane endpoints by transport name.
        timeout: Seconds to wait for the coordinator and for every rank.
        heartbeat_timeout: Seconds of silence after which the service
            declares a rank failed (rank 0 only; None: PYCOLLECTIVE_HEARTBEAT_TIMEOUT).
        announce: Rank 0 only: called with the service's ``host:port`` once it listens,
            before waiting for the others (how a launcher's own store passes the address on).

    Returns:
        ``(client, peers, service)``: this rank's client, the peer table
        ordered by rank, and the service on rank 0 (None on other ranks). The
        caller closes the client and, on rank 0, stops the service last.

    Raises:
        ValueError: A multi-rank group has no token.
        RendezvousError: The coordinator could not start or be reached, or
            not every rank registered within ``timeout``.
    """
    token = spec.token
    if token is None:
        if spec.world_size > 1:
            raise ValueError(
                f"rank {spec.rank} of {spec.world_size} has no cluster token (from "
                f"{spec.source}): set PYCOLLECTIVE_TOKEN to the same secret on every rank, or "
                "launch with `pycollective run`, which generates one"
            )
        # A single process talks only to itself: any fresh secret will do.
        token = secrets.token_hex(16)

    service: CoordinationService | None = None
    address = spec.master
    if spec.rank == 0:
        # Only the address the others dial (loopback for a single-host job), unless
        # PYCOLLECTIVE_IFNAME asks for another or for all interfaces.
        bind_host = server_host(spec.master_addr)
        service = CoordinationService(
            spec.world_size,
            token,
            host=bind_host,
            port=spec.master_port,
            heartbeat_timeout=heartbeat_timeout,
        )
        _, port = parse_address(service.start())
        if announce is not None:
            try:
                announce(format_address(spec.master_addr, port))
            except BaseException:
                service.stop(grace=0)
                raise
        # Rank 0 dials the address it bound (no name resolution; it works whatever master_addr
        # resolves to here) and, with TLS, checks the name the others check.
        address = format_address(dial_host(bind_host), port)

    client = CoordinationClient(
        address,
        spec.rank,
        token,
        timeout=timeout,
        server_name=spec.master_addr if service is not None else None,
    )
    try:
        peers = client.register(spec.host_id, endpoints, world_size=spec.world_size)
    except BaseException:
        client.close()
        if service is not None:
            service.stop(grace=0)
        raise
    return client, peers, service
