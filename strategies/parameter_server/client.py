"""Client side of the parameter servers: one channel per task, calls with deadlines, errors
that name the task.

The coordinator and every worker hold one :class:`PSClient`. Calls to several parameter servers
(the shards of a variable, the variables of a step) are issued together and waited for
together, so a step costs one round trip whatever the number of ps tasks.

Tensor bytes (Pull, Push, Assign) travel over each ps task's native data plane
(data_plane.py): pooled native channels, found through the task's Ping. gRPC carries the
control calls. A ps task that offers no data plane (``data_port`` 0) is served over gRPC, where
tensors larger than ``STREAM_BYTES`` travel as a stream of ``CHUNK_BYTES`` pieces.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from pycollective._calls import new_output
from pycollective.rendezvous import tls

from . import ps_pb2 as pb
from . import ps_pb2_grpc as pb_grpc
from . import wire
from .data_client import DataCall, DataPlaneClient
from .data_plane import tensor_headers
from .errors import CancelledError, UnavailableError, ps_task

# On a worker, while it runs a scheduled function: an Event set once the coordinator's call for
# that function ended (the coordinator gave up on it: its connection broke or the function ran
# past closure_timeout). The coordinator may run the function again elsewhere, so this run must
# not write any more: its pushes and assigns are refused from then on (see abandoned_writes).
_run = threading.local()


def set_abandon_event(event: threading.Event | None) -> None:
    """The worker service marks the thread that runs a scheduled function (None: done)."""
    _run.abandoned = event


def _refuse_abandoned_writes() -> None:
    event = getattr(_run, "abandoned", None)
    if event is not None and event.is_set():
        raise CancelledError(
            "the coordinator gave up on this scheduled function (its call ended) while it "
            "still ran here, and may run it again elsewhere: its writes to the parameter "
            "servers stop here, so its update is not applied twice"
        )


# gRPC codes that mean "the task is gone or did not answer in time".
UNREACHABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)

#: requests and replies with more tensor bytes than this are streamed in chunks
STREAM_BYTES = 4 << 20
#: bytes per chunk of a stream
CHUNK_BYTES = 2 << 20

_CHUNK_TYPES = {"Push": pb.PushChunk, "Assign": pb.AssignChunk}
_TENSOR_FIELDS = {"Push": "gradients", "Assign": "values"}


class PSCall:
    """One call for :meth:`PSClient.call_many`: a ps task, a method name and its request.

    For "Push" and "Assign", ``arrays`` are the request's tensors (gradients, values) as numpy
    arrays: the client sends them inline or streams them, by size.
    """

    __slots__ = ("address", "arrays", "method", "request", "task", "timeout")

    def __init__(
        self,
        address: str,
        task: int,
        method: str,
        request: Any,
        timeout: float | None = None,
        arrays: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.address = address
        self.task = task
        self.method = method
        self.request = request
        self.timeout = timeout
        self.arrays = arrays


class PullEntry:
    """One tensor to pull: its key, shape and dtype, and optionally the (C-contiguous) array to
    write it into."""

    __slots__ = ("dtype", "key", "out", "shape")

    def __init__(
        self, key: str, shape: tuple[int, ...], dtype: Any, out: np.ndarray | None = None
    ) -> None:
        self.key, self.shape, self.dtype, self.out = key, tuple(shape), np.dtype(dtype), out

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def byte_view(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 array (sharing memory)."""
    return array.reshape(-1).view(np.uint8)


class PSClient:
    """Calls to parameter-server tasks.

    Args:
        token: the cluster token (sent as metadata with every call).
        rpc_timeout: default deadline of every call, in seconds.
    """

    def __init__(self, token: str, rpc_timeout: float) -> None:
        self._metadata = wire.metadata(token)
        self.rpc_timeout = float(rpc_timeout)
        self._stubs: dict[str, pb_grpc.ParameterServerStub] = {}
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()
        self._streams: futures.ThreadPoolExecutor | None = None
        self._data = DataPlaneClient(token, self._ping, describe_failure)

    def _ping(self, task: int, address: str, timeout: float) -> pb.PingResponse:
        call = PSCall(address, task, "Ping", pb.PingRequest(), timeout)
        try:
            return self.stub(address).Ping(
                call.request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            raise translate(exc, call) from None

    def ping(self, task: int, address: str, timeout: float) -> pb.PingResponse:
        """Asks a ps task who it is (its incarnation changes when it restarts); raises
        UnavailableError naming it when it does not answer within ``timeout`` seconds."""
        return self._ping(task, address, timeout)

    def _data_plane(self, task: int, address: str, timeout: float) -> bool:
        return self._data.available(task, address, timeout)

    def writes_seen(self) -> dict[int, int]:
        """ps task -> the newest write clock this client saw (ParameterServerService.writes)."""
        return self._data.writes_seen()

    def observe_writes(self, clocks: Any) -> None:
        """Takes note of write clocks seen by others (a worker's closure, for the coordinator)."""
        self._data.observe_writes(clocks)

    def push_and_read(
        self, calls: Sequence[PSCall], reads: dict[int, list[PullEntry]]
    ) -> tuple[list[Any], dict[str, np.ndarray], dict[int, int]]:
        """Push calls (one per ps task) that also read ``reads[task]`` once their gradients are
        applied: one exchange per task. Returns the PushResponses, the values read and each
        task's write clock of those values. A task without a data plane gets a plain push
        (nothing read)."""
        _refuse_abandoned_writes()
        timeout = self.rpc_timeout
        if (
            not all(self._data_plane(c.task, c.address, c.timeout or timeout) for c in calls)
            or not calls
        ):
            return self.call_many(calls), {}, {}
        out: dict[str, np.ndarray] = {}
        data_calls = []
        for c in calls:
            c.timeout = timeout if c.timeout is None else c.timeout
            d = _data_call(c)
            entries = reads.get(c.task, [])
            d.request.pull_after.extend(e.key for e in entries)
            d.destinations = _pull_destinations(c.task, list(entries), out)
            data_calls.append(d)
        replies = self._data.exchange(data_calls)
        responses = [pb.PushResponse(version=r.version, iterations=r.iterations) for r in replies]
        clocks = {c.task: r.writes for c, r in zip(calls, replies) if reads.get(c.task)}
        return responses, out, clocks

    def stub(self, address: str) -> pb_grpc.ParameterServerStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = tls.channel(address, options=wire.channel_options())
                self._channels.append(channel)
                stub = self._stubs[address] = pb_grpc.ParameterServerStub(channel)
            return stub

    def _executor(self) -> futures.ThreadPoolExecutor:
        with self._lock:
            if self._streams is None:
                self._streams = futures.ThreadPoolExecutor(
                    max_workers=8, thread_name_prefix="pc-ps-pull"
                )
            return self._streams

    # Calls ------------------------------------------------------------------------------------------

    def call(
        self, address: str, task: int, method: str, request: Any, timeout: float | None = None
    ) -> Any:
        return self.call_many([PSCall(address, task, method, request, timeout)])[0]

    def call_many(self, calls: Sequence[PSCall]) -> list[Any]:
        """Issues every call at once, waits for all; raises the first failure (after all
        finished, so no call is left running), as UnavailableError naming the task when it was
        unreachable or slow, RuntimeError otherwise. On a worker whose function the coordinator
        gave up on, raises CancelledError before sending anything."""
        _refuse_abandoned_writes()
        pending: list[Any] = []
        data_calls: list[DataCall] = []
        for c in calls:
            timeout = c.timeout = self.rpc_timeout if c.timeout is None else c.timeout
            if c.arrays is not None and self._data_plane(c.task, c.address, timeout):
                data_calls.append(_data_call(c))
                pending.append(data_calls[-1])
                continue
            stub = self.stub(c.address)
            request = c.request
            method = c.method
            if c.arrays is not None:
                if sum(a.nbytes for a in c.arrays) > STREAM_BYTES:
                    pending.append(
                        getattr(stub, method + "Stream").future(
                            _request_chunks(c),
                            timeout=timeout,
                            metadata=self._metadata,
                            wait_for_ready=True,
                        )
                    )
                    continue
                getattr(request, _TENSOR_FIELDS[method]).extend(
                    wire.encode_tensor(a) for a in c.arrays
                )
            # wait_for_ready: a task that is (re)starting is waited for, within the deadline.
            pending.append(
                getattr(stub, method).future(
                    request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
                )
            )
        data_error: BaseException | None = None
        if data_calls:
            try:
                self._data.exchange(data_calls)
            except BaseException as exc:  # noqa: BLE001 - raised after the gRPC calls finished
                data_error = exc
        if data_error is not None:
            for p in pending:  # no gRPC call is left running
                if not isinstance(p, DataCall):
                    p.exception()
            raise data_error
        return self._collect(
            calls, [_data_result(p) if isinstance(p, DataCall) else p.result for p in pending]
        )

    def pull(
        self, requests: Sequence[tuple[int, str, Sequence[PullEntry]]], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """Reads tensors from several ps tasks at once: ``[(task, address, entries), ...]``.
        Returns key -> array (the entry's ``out`` when given; otherwise a read-only array)."""
        timeout = self.rpc_timeout if timeout is None else timeout
        if all(self._data_plane(task, address, timeout) for task, address, _ in requests):
            return self._pull_data_plane(requests, timeout)
        calls, waits = [], []
        for task, address, entries in requests:
            request = pb.PullRequest(keys=[e.key for e in entries])
            calls.append(PSCall(address, task, "Pull", request, timeout))
            stub = self.stub(address)
            if sum(e.nbytes for e in entries) > STREAM_BYTES:
                waits.append(
                    self._executor()
                    .submit(_pull_stream, stub, request, list(entries), timeout, self._metadata)
                    .result
                )
            else:
                waits.append(
                    stub.Pull.future(
                        request, timeout=timeout, metadata=self._metadata, wait_for_ready=True
                    ).result
                )
        out: dict[str, np.ndarray] = {}
        for (task, _address, entries), result in zip(requests, self._collect(calls, waits)):
            if isinstance(result, pb.PullResponse):
                for entry, tensor in zip(entries, result.values):
                    value = wire.decode_tensor(tensor)
                    if value.shape != entry.shape:
                        raise RuntimeError(
                            f"{ps_task(task)} returned shape {value.shape} for "
                            f"{entry.key!r}, expected {entry.shape}"
                        )
                    if entry.out is not None:
                        np.copyto(entry.out, value)
                        value = entry.out
                    out[entry.key] = value
            else:
                out.update(result)
        return out

    def _pull_data_plane(
        self, requests: Sequence[tuple[int, str, Sequence[PullEntry]]], timeout: float
    ) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        calls = [
            DataCall(
                task,
                address,
                "Pull",
                pb.DataRequest(pull=pb.PullRequest(keys=[e.key for e in entries]), timeout=timeout),
                destinations=_pull_destinations(task, list(entries), out),
                timeout=timeout,
            )
            for task, address, entries in requests
        ]
        self._data.exchange(calls)
        return out

    def _collect(self, calls: Sequence[PSCall], waits: Sequence[Any]) -> list[Any]:
        results, first_error = [], None
        for c, wait in zip(calls, waits):
            try:
                results.append(wait())
            except grpc.RpcError as exc:
                results.append(None)
                if first_error is None:
                    first_error = translate(exc, c)
            except Exception as exc:  # noqa: BLE001 - a malformed reply
                results.append(None)
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error
        return results

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()
            if self._streams is not None:
                self._streams.shutdown(wait=False)
                self._streams = None
        self._data.close()


def _request_chunks(call: PSCall) -> Iterator[Any]:
    """The messages of a client stream: the request with tensor headers, then the chunks."""
    chunk_type = _CHUNK_TYPES[call.method]
    header = type(call.request)()
    header.CopyFrom(call.request)
    getattr(header, _TENSOR_FIELDS[call.method]).extend(
        pb.Tensor(dtype=a.dtype.str, shape=a.shape) for a in call.arrays
    )
    yield chunk_type(header=header)
    for index, array in enumerate(call.arrays):
        flat = byte_view(np.ascontiguousarray(array))
        for offset in range(0, flat.size, CHUNK_BYTES):
            yield chunk_type(
                tensor=index, offset=offset, data=flat[offset : offset + CHUNK_BYTES].tobytes()
            )


def _pull_stream(
    stub: pb_grpc.ParameterServerStub,
    request: pb.PullRequest,
    entries: list[PullEntry],
    timeout: float,
    metadata: Any,
) -> dict[str, np.ndarray]:
    stream = stub.PullStream(request, timeout=timeout, metadata=metadata, wait_for_ready=True)
    first = next(stream)
    if len(first.headers) != len(entries):
        raise RuntimeError(
            f"PullStream returned {len(first.headers)} tensors for {len(entries)} keys"
        )
    arrays, views, received = [], [], []
    for entry, header in zip(entries, first.headers):
        _check_tensor(entry, header, "PullStream")
        array = entry.out if entry.out is not None else np.empty(entry.shape, entry.dtype)
        arrays.append(array)
        views.append(byte_view(array))
        received.append(0)
    for chunk in stream:
        view = views[chunk.tensor]
        end = chunk.offset + len(chunk.data)
        if end > view.size:
            raise RuntimeError(
                f"PullStream chunk [{chunk.offset}, {end}) outside tensor "
                f"{chunk.tensor} of {view.size} bytes"
            )
        view[chunk.offset : end] = np.frombuffer(chunk.data, np.uint8)
        received[chunk.tensor] += len(chunk.data)
    for entry, view, count in zip(entries, views, received):
        if count != view.size:
            raise RuntimeError(f"PullStream sent {count} of {view.size} bytes of {entry.key!r}")
    return {e.key: a for e, a in zip(entries, arrays)}


def translate(exc: grpc.RpcError, call: PSCall) -> Exception:
    """A gRPC failure of ``call`` as the error users see."""
    code = exc.code() if hasattr(exc, "code") else None
    return describe_failure(
        code, wire.rpc_detail(exc), call.task, call.address, call.method, call.timeout
    )


def describe_failure(
    code: grpc.StatusCode | None,
    detail: str,
    task_index: int,
    address: str,
    method: str,
    timeout: float | None,
) -> Exception:
    """The error users see for a call the ps task refused or did not answer (over gRPC or its
    data plane)."""
    task = ps_task(task_index)
    if code in UNREACHABLE:
        within = f" within {timeout:g} s" if timeout else ""
        return UnavailableError(
            f"parameter server {task} ({address}) did not answer {method}{within} ({detail}).",
            task=task,
            address=address,
            advice="If it died, restart it and restore the last checkpoint (Checkpoint.restore) "
            "before scheduling more steps: its variables are lost.",
        )
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
        return UnavailableError(
            f"parameter server {task} ({address}) no longer has the state this call needs "
            f"({detail}); it probably restarted.",
            task=task,
            address=address,
            advice="Restore the last checkpoint (Checkpoint.restore) to put the variables back.",
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return PermissionError(f"parameter server {task} ({address}) refused {method}: {detail}")
    return RuntimeError(f"parameter server {task} ({address}) failed {method}: {detail}")


def _data_call(call: PSCall) -> DataCall:
    """A Push or Assign with arrays as a data-plane request (tensor headers in the message,
    bytes as frames)."""
    request = type(call.request)()
    request.CopyFrom(call.request)
    arrays = [np.ascontiguousarray(a) for a in call.arrays or ()]
    for a in arrays:
        if a.dtype.kind not in "biufc":
            raise TypeError(
                f"only numeric tensors travel to and from parameter servers, got dtype {a.dtype}"
            )
    getattr(request, _TENSOR_FIELDS[call.method]).extend(tensor_headers(arrays))
    op = {"Push": "push", "Assign": "assign"}[call.method]
    return DataCall(
        call.task,
        call.address,
        call.method,
        pb.DataRequest(**{op: request}, timeout=call.timeout or 0.0),
        arrays,
        timeout=call.timeout or 30.0,
    )


def _data_result(call: DataCall) -> Any:
    """The gRPC-shaped response of a finished data-plane call (PushResponse, AssignResponse)."""

    def result() -> Any:
        reply = call.reply
        if call.method == "Push" and reply is not None:
            return pb.PushResponse(version=reply.version, iterations=reply.iterations)
        return pb.AssignResponse()

    return result


def _pull_destinations(task: int, entries: list[PullEntry], out: dict[str, np.ndarray]) -> Any:
    def destinations(reply: pb.DataReply, inline: np.ndarray) -> list[np.ndarray]:
        if len(reply.values) != len(entries):
            raise RuntimeError(
                f"{ps_task(task)} returned {len(reply.values)} tensors for {len(entries)} keys"
            )
        arrays = []
        for entry, header in zip(entries, reply.values):
            _check_tensor(entry, header, ps_task(task))
            array = entry.out if entry.out is not None else new_output(entry.shape, entry.dtype)
            out[entry.key] = array
            arrays.append(array)
        return arrays

    return destinations


def _check_tensor(entry: Any, header: Any, source: str) -> None:
    """A returned tensor's header must name the dtype and shape the caller asked for."""
    dtype = wire.check_dtype(header.dtype)
    if tuple(header.shape) != entry.shape or dtype != entry.dtype:
        raise RuntimeError(
            f"{source} returned {dtype}{list(header.shape)} for "
            f"{entry.key!r}, expected {entry.dtype}{list(entry.shape)}"
        )
