"""The portable "grpc" transport: each pair of ranks shares one bidirectional gRPC stream (the
higher rank dials the lower rank's data-plane server) that carries the frames of a native
bridged link (csrc/transport/bridge.h). Slower than tcp (every frame is copied into a protobuf
message and crosses the GIL) but it goes wherever gRPC goes; the benchmark measures the cost.
Streams are authenticated with the cluster token like every other connection, and run over
mutual TLS when PYCOLLECTIVE_TLS_* are set (pycollective/rendezvous/tls.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc

from pycollective._ext import _C
from pycollective.rendezvous import dataplane_pb2 as pb
from pycollective.rendezvous import dataplane_pb2_grpc as pb_grpc
from pycollective.rendezvous import tls
from pycollective.rendezvous.auth import TokenInterceptor
from pycollective.rendezvous.client import TOKEN_METADATA_KEY
from pycollective.rendezvous.cluster import format_address

RANK_METADATA_KEY = "x-pycollective-rank"
_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
_POLL_S = 0.2  # how often a pump re-checks whether its link closed


class GrpcDataPlane:
    """One rank's gRPC data plane: a server for streams from higher ranks, streams dialed to
    lower ranks, and the native bridged link of each peer."""

    def __init__(
        self, rank: int, token: str, bind_host: str, advertised_host: str, connect_timeout: float
    ) -> None:
        self.rank, self._token = rank, token
        self._connect_timeout = connect_timeout
        self._ends: dict[int, object] = {}
        self._ends_ready = threading.Condition()
        self._closed = threading.Event()
        # Pumps run on gRPC's daemon threads. One must never be inside native code (the GIL
        # released) when the interpreter finalizes: re-taking the GIL then ends the thread with
        # a forced unwind through C++ destructors, which aborts the process ("terminate called
        # without an active exception"). close() waits until none is in there.
        self._pumps_in_native = 0
        self._pumps_idle = threading.Condition()
        self._channels: list[grpc.Channel] = []
        self._threads: list[threading.Thread] = []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=64),
            options=_UNLIMITED,
            interceptors=[TokenInterceptor(token, f"rank {rank}'s data plane")],
        )
        pb_grpc.add_DataPlaneServicer_to_server(_Servicer(self), self._server)
        port = tls.add_port(self._server, format_address(bind_host, 0))
        self._server.start()
        self.endpoint = f"{advertised_host}:{port}"

    def link(self, peer: int, endpoint: str):
        """The native link to `peer`; dials it when it is the lower rank."""
        handle, end = _C.bridge_link(rank=self.rank, peer=peer, via=f"grpc {endpoint}")
        with self._ends_ready:
            self._ends[peer] = end
            self._ends_ready.notify_all()
        if peer < self.rank:
            channel = tls.channel(endpoint, options=_UNLIMITED)
            self._channels.append(channel)
            grpc.channel_ready_future(channel).result(timeout=self._connect_timeout)
            responses = pb_grpc.DataPlaneStub(channel).Stream(
                self.outgoing(end),
                metadata=((TOKEN_METADATA_KEY, self._token), (RANK_METADATA_KEY, str(self.rank))),
            )
            self.start_receiver(responses, end, peer)
        return handle

    def start_receiver(self, frames: Iterator[pb.Frame], end, peer: int) -> None:
        thread = threading.Thread(
            target=self.incoming, args=(frames, end, peer), daemon=True, name=f"grpc-recv-{peer}"
        )
        self._threads.append(thread)
        thread.start()

    def end_for(self, peer: int):
        """The end a stream from `peer` belongs to (waits briefly: the peer may dial first)."""
        with self._ends_ready:
            self._ends_ready.wait_for(
                lambda: peer in self._ends or self._closed.is_set(), timeout=self._connect_timeout
            )
            return self._ends.get(peer)

    def outgoing(self, end) -> Iterator[pb.Frame]:
        """Frames the native link posted, until the link fails or the plane closes."""
        while not self._closed.is_set():
            item = self._take_outgoing(end)
            if item is not None:
                yield pb.Frame(header=item[0], payload=item[1])
            elif end.failed or self._closed.is_set():
                return

    def _take_outgoing(self, end):
        """end.take_outgoing, unless the plane closed (see _pumps_in_native)."""
        with self._pumps_idle:
            if self._closed.is_set():
                return None
            self._pumps_in_native += 1
        try:
            return end.take_outgoing(_POLL_S)
        finally:
            with self._pumps_idle:
                self._pumps_in_native -= 1
                self._pumps_idle.notify_all()

    def incoming(self, frames: Iterator[pb.Frame], end, peer: int) -> None:
        """Hands received frames to the native link; a broken stream fails the link."""
        try:
            for frame in frames:
                end.deliver(frame.header, frame.payload)
            reason = "closed its grpc stream"
        except grpc.RpcError as exc:
            # Client-side errors carry a status; the server's request iterator raises a bare one.
            status = f"{exc.code().name}: {exc.details()}" if hasattr(exc, "code") else "cancelled"
            reason = f"grpc stream broke ({status})"
        except Exception as exc:  # a malformed frame: the link must not wait for more
            reason = f"sent a malformed frame ({exc})"
        if not self._closed.is_set():
            end.fail(
                f"rank {peer} {reason} while rank {self.rank} was talking to it: it exited, "
                "crashed or aborted"
            )

    def close(self) -> None:
        self._closed.set()
        with self._ends_ready:
            self._ends_ready.notify_all()
            for end in self._ends.values():
                end.fail("the group was shut down")
        # Our own streams first, so the peers' servers are not left to cut them (which gRPC
        # reports as GOAWAY noise on stderr).
        for channel in self._channels:
            channel.close()
        self._server.stop(grace=0.5).wait(2.0)
        # The receivers end with their streams; wait for them so none still touches a link
        # while the interpreter shuts down. The failed ends release any pump at once.
        for thread in self._threads:
            thread.join(timeout=2.0)
        with self._pumps_idle:
            self._pumps_idle.wait_for(lambda: self._pumps_in_native == 0, timeout=2.0)


class _Servicer(pb_grpc.DataPlaneServicer):
    def __init__(self, plane: GrpcDataPlane) -> None:
        self._plane = plane

    def Stream(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        meta = dict(context.invocation_metadata())  # the token was checked by the interceptor
        try:
            peer = int(meta.get(RANK_METADATA_KEY, ""))
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no rank in the stream's metadata")
        end = self._plane.end_for(peer)
        if end is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"rank {self._plane.rank} has no grpc link to rank {peer}",
            )
        self._plane.start_receiver(request_iterator, end, peer)
        yield from self._plane.outgoing(end)
