"""Elastic rendezvous: a process group that re-forms, in the same processes, with whoever is alive.

A store that outlives the ranks keeps *rounds*: ``pycollective run -n MIN:MAX`` hosts it in the
launcher process (as torchrun's agent hosts its c10d store), and tells the ranks where it is in
``PYCOLLECTIVE_ELASTIC_STORE``. Every ``pycollective.init()`` under it *joins*: it writes a join
record (host, pid, the rank it had before, the smallest group it accepts) and waits for its
assignment. The store's controller closes a round once every live process of the job has joined
(the launcher knows which are alive), or once enough have joined and the rest stayed away for
``last_call`` seconds. It numbers the members -- survivors keep their order, newcomers come last
-- and writes each one's round, rank and world size. The new rank 0 starts the group's
coordination service on a port its OS picks and publishes the address under the round; the
others read it there. So when rank 0 dies, the rank-0 role and the coordinator move to a
survivor, and nobody needs to know an address in advance but the store's.

The store is the coordination service's key-value store (the same gRPC service, token and
checks), driven from the process that hosts it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .client import CoordinationClient, RendezvousError
from .cluster import format_address, is_loopback, parse_address
from .job_file import pid_alive
from .service import CoordinationService

_log = logging.getLogger("pycollective.rendezvous")

# Where the store is: set by the elastic launcher for every process it starts.
ENV_STORE = "PYCOLLECTIVE_ELASTIC_STORE"

_JOIN = "elastic/join/"  # + process uid: its join record (JSON)
_ASSIGN = "elastic/assign/"  # + process uid: its place in a round (JSON)
_MASTER = "elastic/master/"  # + round: "host:port" of that group's coordination service
# How often the controller looks at the joins (a round closes at most this late).
_CONTROL_POLL_S = 0.02


@dataclass(frozen=True)
class Assignment:
    """A process's place in a re-formed group."""

    round: int
    rank: int
    world_size: int


@dataclass
class _Joiner:
    uid: str
    node: str
    pid: int
    previous_rank: int
    min_size: int
    arrival: int
    placed: bool = False


class ElasticStore:
    """The rendezvous store and its round controller, hosted by a process that outlives ranks.

    Args:
        token: The cluster token every rank carries.
        min_size: No round closes with fewer members.
        max_size: No round has more; more joiners wait for the next round.
        live_count: How many processes of the job are alive now (the launcher's count): a
            round closes as soon as that many have joined. None: only ``max_size`` joiners or
            the last call close it.
        last_call: Seconds after the first joiner of a round that it closes with whoever
            joined, if that is at least the minimum (a live process that never joins, e.g. a
            hung one, cannot hold the others forever).
        host, port: Where the store listens (loopback and a port the OS picks by default).
        on_round: Called with each round's number and size as it forms.
    """

    def __init__(
        self,
        token: str,
        min_size: int,
        max_size: int,
        *,
        live_count: Callable[[], int] | None = None,
        last_call: float = 30.0,
        host: str = "127.0.0.1",
        port: int = 0,
        on_round: Callable[[int, int], None] | None = None,
    ) -> None:
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}:{max_size}")
        if last_call <= 0:
            raise ValueError(f"last_call must be > 0 seconds, got {last_call}")
        self.min_size, self.max_size = min_size, max_size
        self.last_call = last_call
        self.rounds: list[tuple[int, list[int]]] = []  # (round, member pids), for reports
        self._live_count = live_count
        self._on_round = on_round
        # Each joiner blocks a handler thread in get() while its round forms: a pool sized for
        # a world of one (12 threads) left a 13th joiner's set() queued behind them, unseen.
        self._service = CoordinationService(1, token, host=host, port=port, clients=max_size)
        self._joiners: dict[str, _Joiner] = {}
        self._first_wait: float | None = None
        self._node = socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self._service.address

    def start(self) -> str:
        """Starts serving and controlling rounds; returns ``host:port``."""
        address = self._service.start()
        self._thread = threading.Thread(target=self._control, name="pc-elastic", daemon=True)
        self._thread.start()
        return address

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._service.stop(grace=0)

    def __enter__(self) -> ElasticStore:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _control(self) -> None:
        while not self._stop.wait(_CONTROL_POLL_S):
            try:
                self.step(time.monotonic())
            except Exception:  # the controller must outlive one bad record
                _log.exception("elastic rendezvous: controlling a round failed")

    def step(self, now: float) -> Assignment | None:
        """Reads new joins and closes a round when it is due; returns rank 0's assignment of the
        round it closed, else None. (The controller thread calls it; tests may too.)"""
        for key, raw in self._service.local_items(_JOIN).items():
            uid = key[len(_JOIN) :]
            if uid not in self._joiners:
                joiner = _parse_join(uid, raw, len(self._joiners))
                if joiner is None:
                    self._joiners[uid] = _Joiner(uid, "", 0, -1, 1, 0, placed=True)
                else:
                    self._joiners[uid] = joiner
        waiting = [j for j in self._joiners.values() if not j.placed]
        for j in waiting:
            if j.node == self._node and not pid_alive(j.pid):
                j.placed = True  # died while waiting: it joins nothing
        waiting = [j for j in waiting if not j.placed]
        if not waiting:
            self._first_wait = None
            return None
        if self._first_wait is None:
            self._first_wait = now
        need = max([self.min_size] + [j.min_size for j in waiting])
        expected = self._live_count() if self._live_count is not None else self.max_size
        count = len(waiting)
        due = count >= self.max_size or (
            count >= need and (count >= expected or now - self._first_wait >= self.last_call)
        )
        if not due:
            return None
        # Survivors keep their order (so rank 0 stays rank 0 while it lives); newcomers last.
        members = sorted(waiting, key=lambda j: (j.previous_rank < 0, j.previous_rank, j.arrival))[
            : self.max_size
        ]
        round_number = len(self.rounds) + 1
        for rank, j in enumerate(members):
            j.placed = True
            record = {"round": round_number, "rank": rank, "world_size": len(members)}
            self._service.local_set(_ASSIGN + j.uid, json.dumps(record).encode())
        self.rounds.append((round_number, [j.pid for j in members]))
        self._first_wait = None if len(members) == count else now
        _log.info(
            "elastic rendezvous: round %d formed with %d processes (pids %s)",
            round_number,
            len(members),
            [j.pid for j in members],
        )
        if self._on_round is not None:
            self._on_round(round_number, len(members))
        return Assignment(round_number, 0, len(members))


def join(
    store: str,
    token: str,
    *,
    previous_rank: int,
    min_size: int,
    timeout: float,
) -> tuple[Assignment, CoordinationClient]:
    """Joins the next round at the store ``host:port``; returns this process's assignment and
    the store's client (to publish or read the round's coordinator; the caller closes it).

    Raises:
        RendezvousError: The store is unreachable, or no round took this process within
            ``timeout`` seconds (fewer than the minimum joined).
    """
    client = CoordinationClient(store, max(previous_rank, 0), token, timeout=timeout)
    uid = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    record = {
        "node": socket.gethostname(),
        "pid": os.getpid(),
        "previous_rank": previous_rank,
        "min_size": min_size,
    }
    try:
        client.set(_JOIN + uid, json.dumps(record).encode())
        try:
            raw = client.get(_ASSIGN + uid, timeout=timeout)
        except RendezvousError as exc:
            if exc.code != "DEADLINE_EXCEEDED":
                raise
            raise RendezvousError(
                f"pid {os.getpid()} (rank {previous_rank} before) waited {timeout:g} s at the "
                f"elastic rendezvous {store} and no group formed (this process asked for at "
                f"least {min_size}; the store's own minimum, set where it was started, may be "
                "higher): too few are alive, or the others have not noticed the failure yet "
                "(raise the timeout, or lower the minimum size)",
                code=exc.code,
            ) from None
    except BaseException:
        client.close()
        raise
    placed = json.loads(raw)
    return Assignment(int(placed["round"]), int(placed["rank"]), int(placed["world_size"])), client


def publish_coordinator(client: CoordinationClient, round_number: int, address: str) -> None:
    """Rank 0 of a round: tells the round's other members where its coordinator listens."""
    client.set(f"{_MASTER}{round_number}", address.encode())


def coordinator_of(client: CoordinationClient, round_number: int, timeout: float) -> str:
    """The ``host:port`` the round's rank 0 published (waits for it up to ``timeout``)."""
    return client.get(f"{_MASTER}{round_number}", timeout=timeout).decode()


def address_toward(store: str) -> str:
    """This host's address as seen on the way to the store: loopback for a loopback store (a
    single-host job), else the address of the interface that routes there."""
    host, port = parse_address(store)
    if is_loopback(host):
        return "::1" if ":" in host else "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))  # UDP: picks the route, sends nothing
        return str(probe.getsockname()[0])


def coordinator_bind(store: str) -> str:
    """``host:0`` for a new rank 0's coordinator: reachable from the other members, port chosen
    by the OS."""
    return format_address(address_toward(store), 0)


def _parse_join(uid: str, raw: bytes, arrival: int) -> _Joiner | None:
    try:
        record = json.loads(raw)
        return _Joiner(
            uid=uid,
            node=str(record["node"]),
            pid=int(record["pid"]),
            previous_rank=int(record["previous_rank"]),
            min_size=max(1, int(record["min_size"])),
            arrival=arrival,
        )
    except (ValueError, KeyError, TypeError):
        _log.warning("elastic rendezvous: ignored a malformed join record %r", raw[:64])
        return None


def serve(argv: list[str] | None = None) -> int:
    """``python -m pycollective.elastic_store MIN MAX LAST_CALL``: hosts the store in a
    process of its own, for the elastic launcher. The token comes from PYCOLLECTIVE_TOKEN. Prints
    ``address host:port`` once it listens and ``round N SIZE`` as each round forms; reads the
    job's live process count, one number a line, from stdin; exits when stdin closes (the
    launcher is gone) or on SIGTERM.

    Why a process of its own: the launcher forks the ranks, and a process that forks while gRPC
    runs threads in it gets children that gRPC's fork handlers may abort before they exec."""
    import signal
    import sys

    args = sys.argv[1:] if argv is None else argv
    min_size, max_size, last_call = int(args[0]), int(args[1]), float(args[2])
    from pycollective import config

    token = config.text("PYCOLLECTIVE_TOKEN")
    live = [max_size]
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    store = ElasticStore(
        token,
        min_size,
        max_size,
        live_count=lambda: live[0],
        last_call=last_call,
        on_round=lambda number, size: say(f"round {number} {size}"),
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.stdin.close())
    with store:
        say(f"address {store.address}")
        try:
            for line in sys.stdin:
                if line.strip():
                    live[0] = int(line)
        except (ValueError, OSError):
            pass
    return 0
