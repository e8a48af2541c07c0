"""The client side of the ps tasks' data plane (data_plane.py): pooled native channels per ps
task, and exchanges with several tasks at once.

An exchange sends one request to every ps task involved first, then reads the replies: the
tasks work in parallel while the client moves on to the next one. A channel is used by one
exchange at a time; a second caller (another closure on the same worker, another coordinator
thread) takes another channel from the pool, or opens one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from pycollective.channel import Channel, connect, host_identity, shared_memory_allowed
from pycollective.errors import CollectiveError, ProtocolError

from . import ps_pb2 as pb
from .data_plane import SHM_SETUP_TIMEOUT_S, session
from .errors import UnavailableError, ps_task
from .framing import BLOCK, FrameError, receive_header, receive_tensors, send_message

_log = logging.getLogger("pycollective.strategies.parameter_server")

#: a reply's header and packed bytes -> the arrays its tensors go into
Destinations = Callable[[pb.DataReply, np.ndarray], Sequence[np.ndarray]]


@dataclass
class DataCall:
    """One request of an exchange: a ps task, the request (its tensor headers filled in), the
    arrays whose bytes follow it, and where the reply's tensors go."""

    task: int
    address: str
    method: str
    request: pb.DataRequest
    arrays: Sequence[np.ndarray] = ()
    destinations: Destinations | None = None
    timeout: float = 30.0
    reply: pb.DataReply | None = field(default=None, init=False)


@dataclass
class _Pool:
    endpoint: str
    free: list[Channel] = field(default_factory=list)
    #: whether to offer the task shared memory (off after an offer failed)
    shared_memory: bool = field(default_factory=shared_memory_allowed)


class DataPlaneClient:
    """Channels to ps tasks, found with ``ping(task, address, timeout) -> PingResponse``.

    Args:
        token: the cluster token (authenticates every channel).
        ping: asks a ps task (over gRPC) where its data plane listens.
        describe_refusal: ``(code, detail, task, address, method, timeout) -> Exception`` for a
            request the task refused (the same errors as a refused gRPC call).
    """

    def __init__(self, token: str, ping: Callable[..., Any], describe_refusal: Callable) -> None:
        self._token = token
        self._ping = ping
        self._describe_refusal = describe_refusal
        self._pools: dict[str, _Pool | None] = {}
        # Tasks to which adding shared memory failed once: their channels stay on tcp, also
        # after a restart of the task (a new pool), so a failing setup is not paid again.
        self._tcp_only: set[str] = set()
        self._lock = threading.Lock()
        self._blocks = threading.local()
        self._writes: dict[int, int] = {}

    def observe_writes(self, clocks: Any) -> None:
        """Takes note of ps tasks' write clocks (task -> clock) seen elsewhere."""
        with self._lock:
            for task, clock in clocks.items():
                if clock > self._writes.get(task, 0):
                    self._writes[task] = clock

    def writes_seen(self) -> dict[int, int]:
        """ps task -> the newest write clock any reply showed this client (see
        ParameterServerService.writes)."""
        with self._lock:
            return dict(self._writes)

    def available(self, task: int, address: str, timeout: float) -> bool:
        """Whether the task serves a data plane (asks it once; gRPC errors propagate)."""
        with self._lock:
            if address in self._pools:
                return self._pools[address] is not None
        reply = self._ping(task, address, timeout)
        host = address.rpartition(":")[0]
        pool = _Pool(f"{host}:{reply.data_port}") if reply.data_port > 0 else None
        with self._lock:
            if pool is not None and address in self._tcp_only:
                pool.shared_memory = False
            self._pools[address] = pool
        return pool is not None

    def _take(self, call: DataCall) -> Channel:
        with self._lock:
            pool = self._pools.get(call.address)
            channel = pool.free.pop() if pool is not None and pool.free else None
        if channel is not None:
            if not channel.peer_closed():
                return channel
            # The task closed its end while the channel sat idle: it stopped or restarted (and
            # listens elsewhere now). Forget every channel to it and ask it again.
            self._forget(call, channel)
            pool = None
        if pool is None:  # forgotten after a failure: ask the task again (it may have restarted)
            if not self.available(call.task, call.address, call.timeout):
                raise UnavailableError(
                    f"parameter server {ps_task(call.task)} ({call.address}) no longer offers "
                    "a data plane",
                    task=ps_task(call.task),
                    address=call.address,
                )
            with self._lock:
                pool = self._pools[call.address]
        assert pool is not None
        channel = self._connect(call, pool)
        if pool.shared_memory:
            try:
                self._move_to_shared_memory(channel, min(call.timeout, SHM_SETUP_TIMEOUT_S))
            except (CollectiveError, FrameError, OSError, ValueError) as exc:
                # The bytes keep to the socket: slower, never broken by shared memory. (A
                # ValueError: this side's PYCOLLECTIVE_SHM_RING_BYTES is malformed.)
                channel.close()
                pool.shared_memory = False
                with self._lock:
                    self._tcp_only.add(call.address)
                _log.warning(
                    "the data channels to %s stay on tcp: adding shared memory failed (%s)",
                    ps_task(call.task),
                    exc,
                )
                channel = self._connect(call, pool)
        return channel

    def _connect(self, call: DataCall, pool: _Pool) -> Channel:
        return connect(
            pool.endpoint,
            self._token,
            session(ps_task(call.task)),
            call.timeout,
            peer_name=f"parameter server {ps_task(call.task)}",
        )

    def _move_to_shared_memory(self, channel: Channel, timeout: float) -> None:
        """Offers the task to send a new channel's tensor bytes through shared memory; it
        accepts when it runs on this host (it creates the segment, this end opens it)."""
        block = self._block()
        offer = pb.DataRequest(shm=pb.ShmOffer(host=host_identity()), timeout=timeout)
        send_message(channel, block, offer, [])
        reply, inline = receive_header(channel, block, pb.DataReply, timeout)
        receive_tensors(channel, inline, [], timeout)
        if reply.shm_segment:
            channel.use_shared_memory(reply.shm_segment, self._token, False, timeout)

    def _give(self, call: DataCall, channel: Channel) -> None:
        with self._lock:
            pool = self._pools.get(call.address)
            if pool is not None and not channel.closed:
                pool.free.append(channel)
                return
        channel.close()

    def _forget(self, call: DataCall, channel: Channel | None) -> None:
        """After a broken channel: drop it and every idle channel to that task, and ask the task
        again where it listens next time (a restarted task listens elsewhere)."""
        with self._lock:
            pool = self._pools.pop(call.address, None)
        for c in ([channel] if channel is not None else []) + (pool.free if pool else []):
            c.close()

    def _block(self) -> np.ndarray:
        block = getattr(self._blocks, "block", None)
        if block is None:
            block = self._blocks.block = np.empty(BLOCK, np.uint8)
        return block

    def exchange(self, calls: Sequence[DataCall]) -> list[pb.DataReply]:
        """Sends every request, then receives every reply (and its tensors, into
        ``destinations``); raises the first failure once all finished, naming the task."""
        block = self._block()
        channels: list[Channel | None] = [None] * len(calls)
        errors: list[BaseException | None] = [None] * len(calls)
        for i, call in enumerate(calls):
            try:
                opened = channels[i] = self._take(call)
                send_message(opened, block, call.request, call.arrays)
            except BaseException as exc:  # noqa: BLE001 - reported below, after the others
                errors[i] = self._failure(call, channels[i], exc)
        for i, call in enumerate(calls):
            channel = channels[i]
            if errors[i] is not None or channel is None:
                continue
            try:
                reply, inline = receive_header(channel, block, pb.DataReply, call.timeout)
                if reply.error:
                    receive_tensors(channel, inline, [])
                    errors[i] = self._describe_refusal(
                        _status(reply.code),
                        reply.error,
                        call.task,
                        call.address,
                        call.method,
                        call.timeout,
                    )
                else:
                    outs = call.destinations(reply, inline) if call.destinations else []
                    receive_tensors(channel, inline, outs, call.timeout)
                    call.reply = reply
                    self.observe_writes({call.task: reply.writes})
                self._give(call, channel)
            except BaseException as exc:  # noqa: BLE001 - reported below, after the others
                errors[i] = self._failure(call, channel, exc)
        for error in errors:
            if error is not None:
                raise error
        return [c.reply for c in calls]  # type: ignore[misc]

    def _failure(
        self, call: DataCall, channel: Channel | None, exc: BaseException
    ) -> BaseException:
        self._forget(call, channel)
        if not isinstance(exc, (CollectiveError, FrameError, OSError)):
            return exc
        task = ps_task(call.task)
        if isinstance(exc, (FrameError, ProtocolError)):
            return RuntimeError(
                f"parameter server {task} ({call.address}) sent a malformed reply to "
                f"{call.method} over the data plane: {exc}"
            )
        return UnavailableError(
            f"parameter server {task} ({call.address}) did not complete {call.method} over "
            f"its data channel within {call.timeout:g} s ({type(exc).__name__}: {exc}).",
            task=task,
            address=call.address,
            advice="If it died, restart it and restore the last checkpoint (Checkpoint.restore) "
            "before scheduling more steps: its variables are lost.",
        )

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            for c in pool.free if pool else []:
                c.close()


def _status(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
