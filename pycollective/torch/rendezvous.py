"""Forms the pycollective group under torch.distributed, through the store torch gives.

Why the store: whatever torch was given (env:// under torchrun or ``pycollective run``, a
TCPStore or FileStore passed as ``store=``, a tcp:// or file:// init_method), it hands the
backend a working key-value store shared by the group's ranks. Rank 0 starts pycollective's
coordination service on a port the OS picks and publishes "host:port" (and, unless every rank
has PYCOLLECTIVE_TOKEN, a fresh cluster token) under the store; the others read it and join.
So no second port has to be agreed on or kept free, and every store torch supports works.
From there the group is an ordinary pycollective group: links chosen by locality (shared
memory within a host, TCP across hosts), heartbeats, and an abort broadcast on failure.

One pycollective group per process: the first "pycollective" group torch creates (normally the
default group) forms it; later ones (``new_group``) are sub-groups of it, identified by torch's
group name, so only their members take part.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from dataclasses import dataclass

import pycollective as pc
from pycollective import config

_lock = threading.Lock()
_world: _World | None = None
_generation = 0  # worlds formed by this process: keeps a reused store's old keys apart


@dataclass
class _World:
    group: pc.ProcessGroup
    torch_ranks: list[int]  # torch global rank of each pycollective rank


def _coordinator_host(store) -> str:
    """The address the other ranks dial to reach rank 0's coordination service."""
    for var in ("PYCOLLECTIVE_MASTER_ADDR", "MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    while hasattr(store, "underlying_store"):  # PrefixStore
        store = store.underlying_store
    host = getattr(store, "host", None)  # TCPStore: the host every rank already reaches
    return host if host else socket.gethostname()


def _form(store, rank: int, size: int, timeout: float) -> pc.ProcessGroup:
    global _generation
    _generation += 1
    key = f"pycollective/{_generation}"
    own_token = config.text("PYCOLLECTIVE_TOKEN") or None
    if rank == 0:
        token = own_token or secrets.token_hex(16)

        def announce(address: str) -> None:
            # The token only travels when the ranks were not given one: the store is as
            # trusted as torch's own rendezvous, which it already carries.
            store.set(f"{key}/token", "" if own_token else token)
            store.set(f"{key}/master", address)

        return pc.init(
            rank=0,
            world_size=size,
            master=f"{_coordinator_host(store)}:0",
            token=token,
            timeout=timeout,
            connect_timeout=timeout,
            announce=announce,
        )
    try:
        master = store.get(f"{key}/master").decode()
        shared = store.get(f"{key}/token").decode()
    except Exception as exc:  # the store timed out: rank 0 never published
        raise RuntimeError(
            f"[rank {rank}] pycollective: rank 0 did not publish its coordinator address in "
            f"torch's store ({exc}); is rank 0 running and calling init_process_group"
            "('pycollective') too?"
        ) from exc
    token = shared or own_token
    if token is None:
        raise RuntimeError(
            f"[rank {rank}] pycollective: rank 0 uses PYCOLLECTIVE_TOKEN but this "
            "rank has none: set the same PYCOLLECTIVE_TOKEN on every rank"
        )
    return pc.init(
        rank=rank,
        world_size=size,
        master=master,
        token=token,
        timeout=timeout,
        connect_timeout=timeout,
    )


def join(
    store, rank: int, size: int, timeout: float, torch_ranks: list[int], name: str
) -> tuple[pc.ProcessGroup, bool]:
    """The pycollective group for a torch group: ``(group, owned)``. ``torch_ranks`` are the
    torch global ranks of its members (empty for the default group); owned groups are shut
    down with the torch group that formed them."""
    global _world
    with _lock:
        if _world is None:
            if pc.is_initialized():
                raise RuntimeError(
                    f"[rank {rank}] pycollective.init() was already called in this process; the "
                    "torch backend forms its own group: call pycollective.shutdown() first, or "
                    "use pycollective's API directly instead of torch.distributed"
                )
            group = _form(store, rank, size, timeout)
            _world = _World(group, list(torch_ranks) or list(range(size)))
            return group, True
        world = _world
    if not torch_ranks:
        raise RuntimeError(
            f"[rank {rank}] a pycollective group is already formed in this "
            "process; call torch.distributed.destroy_process_group() before "
            "init_process_group() again"
        )
    missing = [r for r in torch_ranks if r not in world.torch_ranks]
    if missing:
        raise RuntimeError(
            f"[rank {rank}] torch ranks {missing} are not in this process's pycollective group "
            f"(torch ranks {world.torch_ranks}); a 'pycollective' sub-group must be part of the "
            "first 'pycollective' group formed (normally the default group)"
        )
    members = [world.torch_ranks.index(r) for r in torch_ranks]
    group = pc.new_group(members, name=f"torch/{name}")
    return group, False


def leave(timeout: float) -> None:
    """Shuts the formed group down (every link, the coordination service on rank 0)."""
    global _world
    with _lock:
        _world = None
    pc.shutdown(timeout)
