"""Client of the coordination service: one per rank, rank 0 included.

Every call carries the cluster token and a deadline. Failures become
``RendezvousError`` with a message that names the rank, the coordinator
address, what failed and what to check.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pycollective import config

from . import coordination_pb2 as pb
from . import coordination_pb2_grpc as pb_grpc
from . import tls

# The "rank" passed to on_abort when the coordinator itself failed or went
# away (rank 0 hosts it, but the coordinator is what was lost).
COORDINATOR_RANK = -1

TOKEN_METADATA_KEY = "x-pycollective-token"
# The service sends this as initial metadata once it watches a rank.
WATCHING_METADATA_KEY = "x-pycollective-watching"

# Blocking calls get this much more than their timeout as gRPC deadline; the
# service stops waiting this much before the deadline (its _ANSWER_MARGIN_S),
# so it answers first, with an explanation (who is missing).
_DEADLINE_SLACK_S = 0.5
# Calls that never wait on other ranks should answer fast.
_QUICK_CALL_S = 10.0

_log = logging.getLogger("pycollective.rendezvous")


class RendezvousError(RuntimeError):
    """The control plane failed: unreachable coordinator, refused call, timeout, abort.

    Attributes:
        code: The gRPC status name (e.g. ``"DEADLINE_EXCEEDED"``), or None.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        # Errors cross process boundaries in tests and launchers: keep ``code``.
        return (type(self), (str(self), self.code))


@dataclass(frozen=True)
class PeerInfo:
    """One rank of the group as registered with the coordinator.

    Attributes:
        rank: The rank.
        host_id: Its host id (equal ids share a host).
        pid: Its process id on that host.
        endpoints: Data-plane endpoints by transport name.
    """

    rank: int
    host_id: str
    pid: int
    endpoints: dict[str, str]


AbortCallback = Callable[[int, str], None]


class CoordinationClient:
    """One rank's connection to the coordination service.

    Args:
        address: The coordinator's ``"host:port"``.
        rank: This process's rank.
        token: The cluster token (the same on every rank).
        timeout: Default seconds for registration, barriers and gets.
        server_name: With mutual TLS, the name the coordinator's certificate must carry when
            it is not the host of ``address`` (see ``tls.channel``).
    """

    def __init__(
        self,
        address: str,
        rank: int,
        token: str,
        timeout: float = 60.0,
        server_name: str | None = None,
    ) -> None:
        if not token or not token.isascii() or not token.isprintable():
            raise ValueError("the cluster token must be a non-empty printable ASCII string")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.address = address
        self.rank = rank
        self.timeout = timeout
        self._metadata = ((TOKEN_METADATA_KEY, token),)
        # Rank 0 may start after us: reconnect quickly while we wait for it. Mutual TLS when
        # PYCOLLECTIVE_TLS_* are set.
        self._channel = tls.channel(
            address,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
            server_name=server_name,
        )
        self._stub = pb_grpc.CoordinationStub(self._channel)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._watch_call: grpc.Future | None = None
        self._on_abort: AbortCallback | None = None
        self._abort_delivered = False

    # -- bootstrap -------------------------------------------------------------

    def register(
        self, host_id: str, endpoints: dict[str, str], world_size: int = 0
    ) -> list[PeerInfo]:
        """Registers this rank and waits until every rank has registered.

        Retries the connection (rank 0 may not be up yet) until ``timeout``.

        Args:
            host_id: This host's id.
            endpoints: This rank's data-plane endpoints by transport name.
            world_size: The world size this rank expects; 0 skips the check.

        Returns:
            The peer table, one entry per rank, ordered by rank.

        Raises:
            RendezvousError: The coordinator was unreachable, refused the
                registration, or not every rank registered in time.
        """
        start = time.monotonic()
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            raise RendezvousError(
                f"rank {self.rank} could not reach the coordinator at {self.address} within "
                f"{self.timeout:g} s. Is rank 0 running? Is {self.address} reachable from this "
                "host, and is the coordinator address (PYCOLLECTIVE_MASTER_ADDR/PORT or "
                "MASTER_ADDR/PORT) the same on every rank?" + _tls_hint(),
                code="UNAVAILABLE",
            ) from None
        remaining = max(0.1, self.timeout - (time.monotonic() - start))
        request = pb.RegisterRequest(
            rank=self.rank,
            host_id=host_id,
            pid=os.getpid(),
            endpoints=endpoints,
            world_size=world_size,
        )
        response = self._call(
            "register",
            self._stub.Register,
            request,
            remaining + _DEADLINE_SLACK_S,
            timeout_hint="Did every rank start? A rank that crashed before registering leaves "
            "the others waiting; its own output says why.",
        )
        return [PeerInfo(p.rank, p.host_id, p.pid, dict(p.endpoints)) for p in response.peers]

    # -- synchronization and key-value store -----------------------------------

    def barrier(self, name: str, timeout: float | None = None) -> None:
        """Waits until every rank reached the barrier called ``name``.

        Args:
            name: Barrier name; the same name can be reused after it completes.
            timeout: Seconds to wait; the client's default when None.

        Raises:
            RendezvousError: Timeout, abort, or the coordinator is unreachable.
        """
        wait = self.timeout if timeout is None else timeout
        self._call(
            f"barrier {name!r}",
            self._stub.Barrier,
            pb.BarrierRequest(name=name, rank=self.rank),
            wait + _DEADLINE_SLACK_S,
            timeout_hint="Every rank must reach the same barriers in the same order; raise the "
            "timeout if ranks are legitimately slow.",
        )

    def set(self, key: str, value: bytes) -> None:
        """Stores ``value`` under ``key``, waking every rank waiting in ``get``.

        Raises:
            TypeError: ``value`` is not bytes.
            RendezvousError: The coordinator is unreachable or refused the call.
        """
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"set() stores bytes, got {type(value).__name__}")
        self._call(
            f"set({key!r})",
            self._stub.Set,
            pb.SetRequest(key=key, value=bytes(value)),
            min(self.timeout, _QUICK_CALL_S),
        )

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Returns the value of ``key``, waiting until some rank sets it.

        Args:
            key: The key.
            timeout: Seconds to wait; the client's default when None.

        Raises:
            RendezvousError: The key was not set in time, the group was
                aborted, or the coordinator is unreachable.
        """
        wait = self.timeout if timeout is None else timeout
        response = self._call(
            f"get({key!r})",
            self._stub.Get,
            pb.GetRequest(key=key),
            wait + _DEADLINE_SLACK_S,
            timeout_hint="Is another rank going to set this key, under exactly this name?",
        )
        return response.value

    def add(self, key: str, delta: int) -> int:
        """Adds ``delta`` to the counter ``key`` (missing = 0) and returns the new value.

        Raises:
            RendezvousError: The key holds something other than a counter, or
                the coordinator is unreachable.
        """
        response = self._call(
            f"add({key!r})",
            self._stub.Add,
            pb.AddRequest(key=key, delta=delta),
            min(self.timeout, _QUICK_CALL_S),
        )
        return response.value

    # -- liveness and failure ---------------------------------------------------

    def start_heartbeat(
        self,
        on_abort: AbortCallback,
        interval: float | None = None,
        unreachable_after: float | None = None,
    ) -> None:
        """Starts heartbeating and watching for the group's abort.

        Returns once the coordinator watches this rank, so from then on this
        process dying is reported to the others.

        Args:
            on_abort: Called once, from a background thread, with the failed
                rank and the reason when the group is aborted, or with
                ``COORDINATOR_RANK`` when the coordinator becomes unreachable.
            interval: Seconds between heartbeats; None: a quarter of
                PYCOLLECTIVE_HEARTBEAT_TIMEOUT, at most 1 s (a window of 1 s or less with
                beats a second apart declared healthy ranks failed).
            unreachable_after: Seconds since the last answered heartbeat after which the
                coordinator is declared unreachable (frozen, or cut off); None:
                PYCOLLECTIVE_HEARTBEAT_TIMEOUT, the window in which the coordinator declares
                a silent rank failed.

        Raises:
            RendezvousError: The abort watch could not be opened.
            RuntimeError: Already started, or the client is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("start_heartbeat() on a closed CoordinationClient")
            if self._threads:
                raise RuntimeError("start_heartbeat() was already called on this client")
            self._on_abort = on_abort
        if interval is None:
            interval = min(1.0, config.heartbeat_timeout() / 4)
        # The watch stream lives as long as the group; it has no deadline and
        # is cancelled by close(). The heartbeat detects a hung coordinator.
        call = self._stub.WatchAbort(pb.WatchAbortRequest(rank=self.rank), metadata=self._metadata)
        self._watch_call = call
        opened = threading.Event()
        state = {"established": False}
        watcher = threading.Thread(
            target=self._watch,
            args=(call, opened, state),
            name=f"pc-watch-{self.rank}",
            daemon=True,
        )
        beater = threading.Thread(
            target=self._heartbeat,
            args=(interval, unreachable_after),
            name=f"pc-heartbeat-{self.rank}",
            daemon=True,
        )
        self._threads = [watcher, beater]
        watcher.start()
        if not opened.wait(min(self.timeout, _QUICK_CALL_S)):
            call.cancel()
            raise RendezvousError(
                f"rank {self.rank}: the coordinator at {self.address} did not open the abort "
                f"watch within {min(self.timeout, _QUICK_CALL_S):g} s. Is rank 0 overloaded or "
                "stopped?",
                code="DEADLINE_EXCEEDED",
            )
        if not state["established"]:
            # The call ended before the service watched us; its status says why.
            raise self._error("opening the abort watch", call)
        beater.start()

    def abort(self, reason: str) -> bool:
        """Tells the coordinator that this rank failed; it notifies every rank.

        Best effort: this is called while handling a failure, so it logs
        instead of raising.

        Args:
            reason: What went wrong, shown to every rank.

        Returns:
            True if the coordinator received the abort.
        """
        try:
            self._stub.Abort(
                pb.AbortRequest(rank=self.rank, reason=reason),
                timeout=min(self.timeout, 5.0),
                metadata=self._metadata,
            )
            return True
        except grpc.RpcError as exc:
            _log.warning(
                "rank %d could not send its abort to %s (%s): %s",
                self.rank,
                self.address,
                exc.code().name,
                reason,
            )
            return False

    def close(self) -> None:
        """Leaves the group cleanly and releases the connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watching = bool(self._threads)
        if watching and not self._abort_delivered:
            # Leave first, so the coordinator does not read our closing watch
            # stream as this process having died.
            try:
                self._stub.Leave(
                    pb.LeaveRequest(rank=self.rank), timeout=2.0, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                _log.info("rank %d: leave failed (%s)", self.rank, exc.code().name)
        self._closing.set()
        call, self._watch_call = self._watch_call, None
        if call is not None:
            call.cancel()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=2.0)
        self._channel.close()
        # Drop the stream here, not at interpreter teardown: its finalizer takes a lock that
        # gRPC's polling thread also takes, and at teardown that (daemon) thread may have been
        # stopped while holding it, which hangs the exit (seen after a peer's death).
        del call

    def __enter__(self) -> CoordinationClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------

    def _watch(self, call, opened: threading.Event, state: dict[str, bool]) -> None:
        try:
            # Blocks until the service registered the watch or the call failed.
            metadata = call.initial_metadata() or ()
            state["established"] = any(key == WATCHING_METADATA_KEY for key, _ in metadata)
            opened.set()
            if not state["established"]:
                return  # start_heartbeat() reports why the call failed
            for notice in call:
                self._deliver_abort(notice.rank, notice.reason)
                return
            if not self._closing.is_set():
                self._deliver_abort(
                    COORDINATOR_RANK,
                    f"the coordinator at {self.address} ended rank {self.rank}'s abort watch "
                    "without a reason",
                )
        except grpc.RpcError as exc:
            if self._closing.is_set() or not state["established"]:
                return
            self._deliver_abort(
                COORDINATOR_RANK,
                f"rank {self.rank} lost its connection to the coordinator at {self.address} "
                f"({exc.code().name}: {exc.details()}): rank 0, which hosts it, has probably "
                "exited or crashed",
            )
        finally:
            opened.set()

    def _heartbeat(self, interval: float, unreachable_after: float | None) -> None:
        if unreachable_after is None:
            unreachable_after = config.heartbeat_timeout()
        # Counted from the last answer, not the first failure: a frozen or cut-off coordinator
        # lets each call run to its deadline, and the group must learn within the window.
        last_answer = time.monotonic()
        request = pb.HeartbeatRequest(rank=self.rank)
        while not self._closing.is_set() and not self._abort_delivered:
            silent = time.monotonic() - last_answer
            try:
                self._stub.Heartbeat(
                    request,
                    timeout=max(min(2 * interval, unreachable_after - silent), 0.2),
                    metadata=self._metadata,
                )
                last_answer = time.monotonic()
            except grpc.RpcError as exc:
                if self._closing.is_set():
                    return
                silent = time.monotonic() - last_answer
                if silent >= unreachable_after:
                    self._deliver_abort(
                        COORDINATOR_RANK,
                        f"rank {self.rank} cannot reach the coordinator at {self.address}: "
                        f"no heartbeat answered for {silent:.1f} s "
                        f"({exc.code().name}: {exc.details()}); rank 0, which hosts it, has "
                        "probably exited, hung or been cut off from this host",
                    )
                    return
            self._closing.wait(interval)

    def _deliver_abort(self, rank: int, reason: str) -> None:
        """Calls on_abort exactly once, whichever thread noticed first."""
        with self._lock:
            # Once close() began, the group is being left on purpose: the service stopping
            # after everyone left is not a failure.
            if self._abort_delivered or self._on_abort is None or self._closed:
                return
            self._abort_delivered = True
            callback = self._on_abort
        _log.error("rank %d: group aborted: %s", self.rank, reason)
        try:
            callback(rank, reason)
        except Exception:
            _log.exception("rank %d: the on_abort callback raised", self.rank)

    def _call(self, what: str, method, request, deadline: float, timeout_hint: str = ""):
        try:
            return method(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(what, exc, timeout_hint) from None

    def _error(self, what: str, exc: grpc.RpcError, timeout_hint: str = "") -> RendezvousError:
        code = exc.code()
        hints = {
            grpc.StatusCode.UNAUTHENTICATED: "Is the token (PYCOLLECTIVE_TOKEN) the same on "
            "every rank? `pycollective run` sets one for all ranks.",
            grpc.StatusCode.UNAVAILABLE: f"Is rank 0, which hosts the coordinator, still "
            f"running, and is {self.address} reachable from this host?",
            grpc.StatusCode.DEADLINE_EXCEEDED: timeout_hint
            or "The coordinator did not answer in time: is rank 0 stopped or overloaded?",
            grpc.StatusCode.ABORTED: "Another rank failed first; its reason is above.",
            grpc.StatusCode.ALREADY_EXISTS: "Every process needs a distinct rank.",
            grpc.StatusCode.INVALID_ARGUMENT: "Every process needs a distinct rank in "
            "[0, world_size).",
            grpc.StatusCode.FAILED_PRECONDITION: "Launch every rank with the same settings.",
        }
        message = (
            f"rank {self.rank}: {what} against the coordinator at {self.address} failed "
            f"({code.name}): {exc.details()}."
        )
        hint = hints.get(code, "")
        if code == grpc.StatusCode.UNAVAILABLE:
            hint += _tls_hint()
        return RendezvousError(f"{message} {hint}".strip(), code=code.name)


def _tls_hint() -> str:
    """What to check when a TLS handshake may be why the coordinator cannot be reached (gRPC
    reports a failed handshake as an unreachable server)."""
    if tls.configured() is None:
        return ""
    return (
        " With mutual TLS (PYCOLLECTIVE_TLS_*) every rank needs a certificate signed by the "
        "same CA, and the coordinator's certificate must name the address ranks dial."
    )
