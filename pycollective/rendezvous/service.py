"""The coordination service hosted by rank 0: registration, barriers, KV, liveness, abort.

All state lives behind one condition variable. Every blocking handler waits on
it with a deadline taken from the caller's gRPC deadline (capped when a caller
sent none) and also wakes on abort, on stop and when its caller goes away, so
no handler thread can wait forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from pycollective import config

from . import coordination_pb2 as pb
from . import coordination_pb2_grpc as pb_grpc
from . import tls
from .auth import TokenInterceptor
from .client import COORDINATOR_RANK, WATCHING_METADATA_KEY, RendezvousError
from .cluster import format_address

# A caller that sent no deadline still gets an answer eventually.
_MAX_WAIT_WITHOUT_DEADLINE_S = 3600.0
# Answer this much before the caller's deadline so that the caller sees our
# explanation (who is missing) instead of a bare DEADLINE_EXCEEDED.
_ANSWER_MARGIN_S = 0.5
# Upper bound on how long a waiting handler sleeps between checks of its
# caller's liveness; wake-ups are normally immediate (notify_all).
_POLL_S = 0.5

_log = logging.getLogger("pycollective.rendezvous")


@dataclass
class _Barrier:
    # Bumped each time the barrier completes, so a name can be reused.
    generation: int = 0
    arrived: set[int] = field(default_factory=set)


class CoordinationService:
    """gRPC coordination service for one process group (hosted by rank 0).

    Args:
        world_size: Number of ranks in the group.
        token: Shared secret every call must carry (metadata
            ``x-pycollective-token``).
        host: Address to bind (``pycollective.rendezvous.addresses.server_host`` picks it for a
            job); ``"0.0.0.0"`` for all interfaces. Mutual TLS when PYCOLLECTIVE_TLS_* are set
            (pycollective/rendezvous/tls.py).
        port: Port to bind; 0 lets the OS choose.
        heartbeat_timeout: A rank whose abort watch is open and that is then
            silent this many seconds is declared failed and the group aborted (None:
            PYCOLLECTIVE_HEARTBEAT_TIMEOUT).
        clients: How many processes may call it at once (None: ``world_size``); sizes its
            handler threads. The elastic store serves up to the job's largest size with a
            world of one.
    """

    def __init__(
        self,
        world_size: int,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_timeout: float | None = None,
        clients: int | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not token:
            raise ValueError("the coordination service needs a non-empty token")
        if heartbeat_timeout is None:
            heartbeat_timeout = config.heartbeat_timeout()
        if heartbeat_timeout <= 0:
            raise ValueError(f"heartbeat_timeout must be > 0, got {heartbeat_timeout}")
        self.world_size = world_size
        self._clients = max(world_size, clients or 0)
        self.heartbeat_timeout = heartbeat_timeout
        self._token = token
        self._host = host
        self._port = port
        self._address: str | None = None
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._monitor: threading.Thread | None = None
        self._state = _State(self)

    @property
    def address(self) -> str:
        """The bound ``host:port``; valid after ``start()``."""
        if self._address is None:
            raise RuntimeError("the coordination service is not started")
        return self._address

    def start(self) -> str:
        """Binds and starts serving.

        Returns:
            The bound address as ``"host:port"`` (the OS-chosen port when
            ``port`` was 0).

        Raises:
            RendezvousError: The address cannot be bound (e.g. port in use).
        """
        if self._server is not None:
            return self.address
        # Every client can block one handler thread per concurrent call
        # (register/barrier/get, heartbeat, the watch stream): size the pool
        # so that waiting handlers can never starve the calls that release them.
        self._executor = futures.ThreadPoolExecutor(
            max_workers=4 * self._clients + 8, thread_name_prefix="pc-coord"
        )
        server = grpc.server(
            self._executor,
            interceptors=[TokenInterceptor(self._token, "the coordinator")],
            # gRPC enables SO_REUSEPORT by default: two coordinators could then
            # share a port and split the ranks between them without any error.
            options=[("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_CoordinationServicer_to_server(_Servicer(self._state), server)
        wanted = format_address(self._host, self._port)
        try:
            port = tls.add_port(server, wanted)
        except RuntimeError as exc:
            port, detail = 0, f" ({exc})"
        else:
            detail = ""
        if port == 0:
            server.stop(None)
            raise RendezvousError(
                f"the coordination service cannot listen on {wanted}{detail}: is the port "
                "already in use (another job, or a previous run still exiting)? Choose another "
                "PYCOLLECTIVE_MASTER_PORT, the same on every rank."
            )
        server.start()
        self._server = server
        self._address = format_address(self._host, port)
        self._state.address = self._address
        self._monitor = threading.Thread(
            target=self._state.monitor_heartbeats, name="pc-coord-heartbeats", daemon=True
        )
        self._monitor.start()
        _log.info(
            "coordination service for %d ranks listening on %s", self.world_size, self._address
        )
        return self._address

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops serving; waiting calls fail and watchers get a shutdown notice.

        Args:
            grace: Seconds in-flight calls may take to finish before they are
                cancelled; None cancels them at once.
        """
        server = self._server
        if server is None:
            return
        self._server = None
        self._state.begin_stop()
        server.stop(grace).wait(timeout=(grace or 0) + 5.0)
        # The server does not own its pool: without this its idle threads stay until the
        # garbage collector finds the pool (a process that re-forms groups would pile them up).
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._monitor is not None:
            self._monitor.join(timeout=5.0)
        _log.info("coordination service on %s stopped", self._address)

    def wait_until_left(self, timeout: float) -> bool:
        """Waits until every registered rank left (closed its client), so that stopping the
        service next does not read as a failure to anyone. False if some did not in time."""
        deadline = time.monotonic() + timeout
        with self._state.cond:
            while set(self._state.peers) - self._state.left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._state.cond.wait(remaining)
        return True

    def local_items(self, prefix: str) -> dict[str, bytes]:
        """The key-value entries under ``prefix``, read in this process (no RPC): for a host
        process that drives the store itself (the elastic rendezvous in the launcher)."""
        with self._state.cond:
            return {k: v for k, v in self._state.kv.items() if k.startswith(prefix)}

    def local_set(self, key: str, value: bytes) -> None:
        """Sets ``key`` from this process, waking the ranks waiting for it in ``get``."""
        with self._state.cond:
            self._state.kv[key] = bytes(value)
            self._state.cond.notify_all()

    def __enter__(self) -> CoordinationService:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _State:
    """The group's control state, shared by all handler threads."""

    def __init__(self, service: CoordinationService) -> None:
        self.world_size = service.world_size
        self.heartbeat_timeout = service.heartbeat_timeout
        self.address = "(not started)"
        # Condition over an RLock: gRPC may run RPC-termination callbacks on a
        # thread that already holds it.
        self.cond = threading.Condition(threading.RLock())
        self.peers: dict[int, pb.PeerInfo] = {}
        self.barriers: dict[str, _Barrier] = {}
        self.kv: dict[str, bytes] = {}
        self.last_heartbeat: dict[int, float] = {}
        self.left: set[int] = set()
        self.aborted: pb.AbortNotice | None = None
        self.stopping = False
        self._stop_event = threading.Event()

    # -- helpers used by the handlers, all called with ``cond`` held --------

    def describe(self, rank: int) -> str:
        """ "rank 2 (host h, pid 123)" when known, else "rank 2"."""
        peer = self.peers.get(rank)
        if peer is None:
            return f"rank {rank}"
        return f"rank {rank} (host {peer.host_id}, pid {peer.pid})"

    def check_rank(self, rank: int, context: grpc.ServicerContext, call: str) -> None:
        if not 0 <= rank < self.world_size:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{call} from rank {rank}, but this group has ranks 0..{self.world_size - 1} "
                f"(world_size {self.world_size}): check the rank and world size given to "
                "every process",
            )

    def wait(
        self,
        context: grpc.ServicerContext,
        ready: Callable[[], bool],
        timeout_message: Callable[[float], str],
    ) -> None:
        """Waits until ``ready()``; aborts the call on deadline, group abort or stop."""
        remaining = context.time_remaining()
        if remaining is None:
            remaining = _MAX_WAIT_WITHOUT_DEADLINE_S
        budget = max(0.0, remaining - min(_ANSWER_MARGIN_S, remaining / 2))
        start = time.monotonic()
        while not ready():
            if self.aborted is not None:
                context.abort(
                    grpc.StatusCode.ABORTED, f"the group was aborted: {self.aborted.reason}"
                )
            if self.stopping:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the coordination service at {self.address} is shutting down",
                )
            if not context.is_active():
                context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
            waited = time.monotonic() - start
            if waited >= budget:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, timeout_message(waited))
            self.cond.wait(min(budget - waited, _POLL_S))

    def trigger_abort(self, rank: int, reason: str) -> None:
        """Records the group's first failure and wakes every waiter and watcher."""
        with self.cond:
            if self.aborted is not None or self.stopping:
                _log.info("ignored a later failure (group already aborted): %s", reason)
                return
            self.aborted = pb.AbortNotice(rank=rank, reason=reason)
            _log.error("aborting the group: %s", reason)
            self.cond.notify_all()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    # -- lifecycle ----------------------------------------------------------

    def begin_stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._stop_event.set()

    def monitor_heartbeats(self) -> None:
        """Declares a rank failed once it has been silent for heartbeat_timeout."""
        interval = min(_POLL_S, self.heartbeat_timeout / 4)
        while not self._stop_event.wait(interval):
            with self.cond:
                if self.aborted is not None or self.stopping:
                    continue
                now = time.monotonic()
                for rank, last in sorted(self.last_heartbeat.items()):
                    silent = now - last
                    if rank not in self.left and silent > self.heartbeat_timeout:
                        self.trigger_abort(
                            rank,
                            f"{self.describe(rank)} stopped heartbeating: last heard from "
                            f"{silent:.1f} s ago (heartbeat timeout {self.heartbeat_timeout:g} s); "
                            "the process is hung, stopped or its host is unreachable",
                        )
                        break


class _Servicer(pb_grpc.CoordinationServicer):
    """Maps each RPC onto ``_State``; one handler thread per in-flight call."""

    def __init__(self, state: _State) -> None:
        self._s = state

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext):
        s = self._s
        rank = request.rank
        with s.cond:
            s.check_rank(rank, context, "Register")
            if request.world_size and request.world_size != s.world_size:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"rank {rank} was launched with world_size {request.world_size}, but the "
                    f"coordinator at {s.address} serves world_size {s.world_size}: every rank "
                    "must be launched with the same world size",
                )
            existing = s.peers.get(rank)
            # The same process may retry; a different process with this rank may not.
            if existing is not None and (existing.host_id, existing.pid) != (
                request.host_id,
                request.pid,
            ):
                context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"rank {rank} is already registered by pid {existing.pid} on host "
                    f"{existing.host_id}; pid {request.pid} on host {request.host_id} asked for "
                    "the same rank: two processes were given the same rank",
                )
            s.peers[rank] = pb.PeerInfo(
                rank=rank,
                host_id=request.host_id,
                pid=request.pid,
                endpoints=dict(request.endpoints),
            )
            _log.info("%s registered (%d of %d)", s.describe(rank), len(s.peers), s.world_size)
            s.cond.notify_all()

            def missing() -> list[int]:
                return [r for r in range(s.world_size) if r not in s.peers]

            s.wait(
                context,
                lambda: len(s.peers) == s.world_size,
                lambda waited: (
                    f"registration timed out after {waited:.1f} s: {len(s.peers)} of "
                    f"{s.world_size} ranks registered, still missing ranks {missing()}. Are all "
                    f"{s.world_size} processes started and pointed at {s.address}?"
                ),
            )
            return pb.RegisterResponse(peers=[s.peers[r] for r in range(s.world_size)])

    def Barrier(self, request: pb.BarrierRequest, context: grpc.ServicerContext):
        s = self._s
        rank, name = request.rank, request.name
        with s.cond:
            s.check_rank(rank, context, f"Barrier {name!r}")
            barrier = s.barriers.setdefault(name, _Barrier())
            generation = barrier.generation
            barrier.arrived.add(rank)
            if len(barrier.arrived) == s.world_size:
                barrier.generation += 1
                barrier.arrived = set()
                s.cond.notify_all()
                return pb.BarrierResponse()
            try:
                s.wait(
                    context,
                    lambda: barrier.generation != generation,
                    lambda waited: (
                        f"barrier {name!r} timed out after {waited:.1f} s: ranks "
                        f"{sorted(barrier.arrived)} arrived, still waiting for ranks "
                        f"{[r for r in range(s.world_size) if r not in barrier.arrived]}"
                    ),
                )
            except BaseException:
                # A rank that gave up has not arrived, should it try again.
                if barrier.generation == generation:
                    barrier.arrived.discard(rank)
                raise
            return pb.BarrierResponse()

    def Set(self, request: pb.SetRequest, context: grpc.ServicerContext):
        s = self._s
        with s.cond:
            s.kv[request.key] = request.value
            s.cond.notify_all()
        return pb.SetResponse()

    def Get(self, request: pb.GetRequest, context: grpc.ServicerContext):
        s = self._s
        key = request.key
        with s.cond:
            s.wait(
                context,
                lambda: key in s.kv,
                lambda waited: f"key {key!r} was not set within {waited:.1f} s",
            )
            return pb.GetResponse(value=s.kv[key])

    def Add(self, request: pb.AddRequest, context: grpc.ServicerContext):
        s = self._s
        key = request.key
        with s.cond:
            current = s.kv.get(key, b"0")
            try:
                value = int(current.decode("ascii")) + request.delta
            except (UnicodeDecodeError, ValueError):
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"key {key!r} holds {current[:32]!r}, not a counter; add() needs a key "
                    "that is only ever used as a counter",
                )
            if not -(2**63) <= value < 2**63:
                # The answer is an int64: refuse before storing, so the counter stays usable.
                context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"add({key!r}, {request.delta}) would take the counter from "
                    f"{current.decode('ascii', 'replace')} past the 64-bit range",
                )
            # Counters share the KV map as decimal text, so get() can read them.
            s.kv[key] = str(value).encode("ascii")
            s.cond.notify_all()
            return pb.AddResponse(value=value)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext):
        s = self._s
        with s.cond:
            s.check_rank(request.rank, context, "Heartbeat")
            s.last_heartbeat[request.rank] = time.monotonic()
        return pb.HeartbeatResponse()

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext):
        s = self._s
        with s.cond:
            s.check_rank(request.rank, context, "Abort")
            who = s.describe(request.rank)
        s.trigger_abort(request.rank, f"{who} aborted the group: {request.reason}")
        return pb.AbortResponse()

    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext):
        s = self._s
        with s.cond:
            s.check_rank(request.rank, context, "Leave")
            s.left.add(request.rank)
            s.cond.notify_all()
            s.last_heartbeat.pop(request.rank, None)
            _log.info("%s left the group", s.describe(request.rank))
        return pb.LeaveResponse()

    def WatchAbort(
        self, request: pb.WatchAbortRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AbortNotice]:
        s = self._s
        rank = request.rank
        with s.cond:
            s.check_rank(rank, context, "WatchAbort")
            # Liveness is watched from here on, not from the first heartbeat: a process that
            # stops right after opening its watch (before its heartbeat thread ever ran) must
            # still be declared failed.
            if rank not in s.left:
                s.last_heartbeat[rank] = time.monotonic()
        ended_normally = threading.Event()

        def on_rpc_end() -> None:
            # Runs however the stream ends; only an unexpected end is a failure.
            s.wake()
            if ended_normally.is_set():
                return
            with s.cond:
                if s.stopping or rank in s.left:
                    return
                if rank not in s.peers:
                    _log.info("unregistered rank %d stopped watching", rank)
                    return
                who = s.describe(rank)
            s.trigger_abort(
                rank,
                f"{who} lost its connection to the coordinator: the process exited or was "
                "killed without leaving the group",
            )

        context.add_callback(on_rpc_end)
        context.send_initial_metadata(((WATCHING_METADATA_KEY, "1"),))
        with s.cond:
            while s.aborted is None and not s.stopping and context.is_active():
                s.cond.wait(_POLL_S)
            notice = s.aborted
            if notice is None and s.stopping:
                notice = pb.AbortNotice(
                    rank=COORDINATOR_RANK,
                    reason=f"the coordination service at {s.address} was stopped "
                    "(its host process, normally rank 0, is exiting)",
                )
            if notice is not None:
                ended_normally.set()
        if notice is not None:
            yield notice
