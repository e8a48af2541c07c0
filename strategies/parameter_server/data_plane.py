"""The ps task's data plane: Pull, Push and Assign over native channels.

Tensor bytes do not travel in gRPC messages: each client (a worker, the coordinator) opens
native TCP channels to a ps task (pycollective.channel: the process group's ``_C.tcp_link``,
authenticated with the cluster token), and every request and reply moves as one lead frame plus
one frame per large tensor, written by the native link straight from the sender's array into the
receiver's (framing.py). A client on the task's host offers, first thing on a new channel, to
send the large frames through shared memory (``ShmOffer``): the task creates a token-protected
segment for that channel and names it in its reply. gRPC keeps the control plane: Ping (which
says where the data plane listens), optimizers, optimizer state, synchronous replicas,
scheduling.

A step's push may name variables to read once its gradients are applied (``pull_after``): the
reply carries their new values, so a training step costs one exchange per ps task.

Each channel is served by one thread, one request at a time, through the same handlers as the
gRPC methods (ps_service.ParameterServerService): a refused request (unknown variable, wrong
shape, unregistered optimizer, a synchronous step that timed out) gets a reply naming the task
and the reason, and the channel goes on. A frame that breaks the protocol (a corrupt header, a
truncated or mistagged frame, a peer that vanished mid-message) closes that one channel with a
logged error naming the task; the task keeps serving every other channel.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Any

import grpc
import numpy as np

from pycollective import config
from pycollective.channel import (
    Channel,
    ChannelListener,
    host_identity,
    shared_memory_allowed,
)
from pycollective.errors import CollectiveError

from . import ps_pb2 as pb
from . import wire
from .framing import BLOCK, FrameError, receive_header, receive_tensors, send_message

_log = logging.getLogger("pycollective.strategies.parameter_server")

#: how long a channel may stay silent in the middle of a message
CHANNEL_TIMEOUT_S = 60.0
#: how long a task waits for a client to open the shared-memory segment it offered
SHM_SETUP_TIMEOUT_S = 10.0
_MAX_DIMS = 32


def session(task: str) -> str:
    """The label both ends put in the channel handshake: a client that dialled another task's
    port fails it."""
    return f"pycollective.parameter_server data plane {task}"


class Refused(Exception):
    """A request the ps task will not carry out (the reply says why, with a gRPC code)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ChannelContext:
    """What the service's handlers need of a grpc.ServicerContext, for a request that came over
    a channel: refusing (raises Refused), the caller's remaining time, whether it still
    listens."""

    def __init__(self, channel: Channel, timeout: float) -> None:
        self._channel = channel
        self._deadline = time.monotonic() + timeout if timeout > 0 else None

    def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Refused(code, message)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        return not self._channel.closed

    def peer(self) -> str:
        return self._channel.peer_name


def tensor_buffers(headers: Any, take: Any) -> list[np.ndarray]:
    """Arrays (from ``take(shape, dtype)``) for the tensors a header announces; FrameError for a
    dtype or shape no tensor can have."""
    arrays = []
    for t in headers:
        try:
            dtype = wire.check_dtype(t.dtype)
        except ValueError as exc:
            raise FrameError(str(exc)) from None
        shape = tuple(int(d) for d in t.shape)
        if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
            raise FrameError(f"a tensor has an invalid shape {shape}")
        arrays.append(take(shape, dtype))
    return arrays


def tensor_headers(arrays: Any) -> list[pb.Tensor]:
    return [pb.Tensor(dtype=a.dtype.str, shape=a.shape) for a in arrays]


class DataPlaneServer:
    """Accepts channels for one ps task and serves each on its own thread.

    Args:
        service: the task's ParameterServerService (its state and handlers).
        token: the cluster token (authenticates every channel).
        host: the address to listen on (the host of the task's gRPC address).
    """

    def __init__(self, service: Any, token: str, host: str) -> None:
        self._service = service
        self._task = service.task
        self._token = token
        self._listener = ChannelListener(
            token, session(self._task), host=host, timeout=CHANNEL_TIMEOUT_S
        )
        self.port = self._listener.port
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._channels: set[Channel] = set()
        #: protocol failures seen (newest last): what closed a channel
        self.failures: list[str] = []
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"pc-ps-data-accept-{service.task_index}", daemon=True
        )
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                channel = self._listener.accept(timeout=0.5)
            except Exception as exc:  # noqa: BLE001 - one bad connection must not stop serving
                if self._stopped.is_set():
                    return
                _log.warning("%s: %s", self._task, exc)
                continue
            if channel is None:
                continue
            with self._lock:
                self._channels.add(channel)
            threading.Thread(
                target=self._serve, args=(channel,), name="pc-ps-data", daemon=True
            ).start()

    def _serve(self, channel: Channel) -> None:
        lead = np.empty(BLOCK, np.uint8)
        reply_block = np.empty(BLOCK, np.uint8)
        try:
            while not self._stopped.is_set():
                if not channel.wait_readable(0.5):
                    continue
                if channel.peer_closed():
                    return  # the client left between requests
                request, inline = receive_header(channel, lead, pb.DataRequest)
                self._handle(channel, request, inline, reply_block)
        except (CollectiveError, FrameError) as exc:
            if not self._stopped.is_set():
                message = (
                    f"{self._task} refused data from {channel.peer_name} and closed that "
                    f"channel (the task keeps serving): {exc}"
                )
                self.failures.append(message)
                _log.error("%s", message)
        finally:
            channel.close(f"{self._task} closed the data channel")
            with self._lock:
                self._channels.discard(channel)

    def _handle(
        self, channel: Channel, request: pb.DataRequest, inline: np.ndarray, block: np.ndarray
    ) -> None:
        op = request.WhichOneof("op")
        service = self._service
        context = ChannelContext(channel, request.timeout)
        if op == "shm":
            receive_tensors(channel, inline, [])
            self._offer_shared_memory(channel, request.shm, block)
            return
        if op == "pull":
            receive_tensors(channel, inline, [])
            try:
                # Sent straight from the variables, pinned (ps_service.reading): no copy, and
                # the values of one moment, while updates go on.
                with service.reading(list(request.pull.keys), context) as (version, writes, arrays):
                    reply = pb.DataReply(
                        values=tensor_headers(arrays), version=version, writes=writes
                    )
                    send_message(channel, block, reply, arrays)
            except Refused as refusal:
                send_message(channel, block, _refusal(refusal), [])
            return
        if op not in ("push", "assign"):
            raise FrameError(f"unknown data-plane request {op!r}")
        message = request.push if op == "push" else request.assign
        headers = message.gradients if op == "push" else message.values
        received = tensor_buffers(headers, service.take_buffer)
        try:
            receive_tensors(channel, inline, received)
        except BaseException:
            service.give_buffers(received)
            raise
        del headers[:]  # the handlers take the arrays, not the header's empty tensors
        pulled: list[np.ndarray] = []
        try:
            if op == "assign":
                kept = service.assign_arrays(message, received, context)
                service.give_buffers([a for a in received if id(a) not in kept])
                received = []
                reply = pb.DataReply(writes=service.writes)
            else:
                pooled, received = received, []
                done = service.push_arrays(message, pooled, context)
                reply = pb.DataReply(
                    version=done.version, iterations=done.iterations, writes=service.writes
                )
                if request.pull_after:
                    # The step's next values, in the same exchange (after its own update).
                    reply.version, reply.writes, pulled = service.snapshot(
                        list(request.pull_after), context
                    )
                    reply.values.extend(tensor_headers(pulled))
            send_message(channel, block, reply, pulled)
        except Refused as refusal:
            send_message(channel, block, _refusal(refusal), [])
        finally:
            service.give_buffers(received)
            service.give_buffers(pulled)

    def _offer_shared_memory(self, channel: Channel, offer: pb.ShmOffer, block: np.ndarray) -> None:
        """A client on this host sends its channel's tensor frames through a fresh shared-memory
        segment: the reply names it (empty when the client is elsewhere, the channel has one
        already, or tcp is forced), then the task creates it and waits for the client to open
        it."""
        same_host = offer.host and offer.host == host_identity()
        name = ""
        if same_host and channel.transport == "tcp" and shared_memory_allowed() and _shm_room():
            name = f"/pycol-ps{self._service.task_index}-{secrets.token_hex(12)}"
        send_message(channel, block, pb.DataReply(shm_segment=name), [])
        if name:
            try:
                channel.use_shared_memory(name, self._token, True, SHM_SETUP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - becomes a protocol failure of this channel
                raise FrameError(
                    f"the shared-memory segment {name} offered to the client was not set up "
                    f"(the client must open it within {SHM_SETUP_TIMEOUT_S:g} s): {exc}"
                ) from exc

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            channels = list(self._channels)
        for channel in channels:
            channel.close(f"{self._task} stopped")


def _shm_room() -> bool:
    """Whether /dev/shm can hold one more channel's segment (its two rings, with room to
    spare). Checked before the offer is accepted: the client waits for a segment it was
    promised, so a creation that then fails (a container's small /dev/shm) would cost it the
    whole setup timeout before it falls back to tcp."""
    need = 4 * config.env_int("PYCOLLECTIVE_SHM_RING_BYTES", 4 << 20)
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return False
    if stat.f_bavail * stat.f_frsize >= need:
        return True
    _log.warning(
        "this ps task keeps a channel on tcp: /dev/shm has %d MiB free, a shared-memory "
        "channel needs %d MiB (raise the container's /dev/shm, or lower "
        "PYCOLLECTIVE_SHM_RING_BYTES)",
        stat.f_bavail * stat.f_frsize >> 20,
        need >> 20,
    )
    return False


def _refusal(refusal: Refused) -> pb.DataReply:
    return pb.DataReply(error=refusal.message, code=refusal.code.value[0])
