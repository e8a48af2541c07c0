"""What crosses the network, and how it is checked.

- Tensors: a ``Tensor`` message (numpy dtype string, shape, raw C-order bytes). Decoding accepts
  only numeric dtypes (bool, integers, floats, complex) and checks that the byte count matches
  the shape: nothing in a tensor can run code.
- Results of scheduled functions: a ``Value`` message, a nest of tensors (lists, tuples, dicts
  with string keys, None, text). Never pickled.
- Pickled Python (a scheduled function with its arguments, an optimizer, a dataset function):
  only inside a ``SignedPayload``. Numpy arrays inside it are pulled out of the pickle into
  ``Tensor`` messages. The payload carries an HMAC-SHA256 over its kind, its pickle and its
  tensors, keyed by a key derived from the cluster token; the receiver recomputes it and
  compares with ``hmac.compare_digest`` *before* unpickling, and refuses the call
  (UNAUTHENTICATED) when it does not match.
- Every call also carries the cluster token in the ``x-pycollective-token`` metadata entry,
  checked by pycollective.rendezvous.auth.TokenInterceptor before any handler runs.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from . import ps_pb2 as pb

try:  # functions defined in __main__ or interactively need cloudpickle
    import cloudpickle as _cloudpickle
except ImportError:  # pragma: no cover - exercised only without cloudpickle
    _cloudpickle = None

TOKEN_METADATA_KEY = "x-pycollective-token"
TOKEN_ENV = "PYCOLLECTIVE_TOKEN"
_KEY_LABEL = b"pycollective.parameter_server payload v1"
_MAX_DIMS = 32
_NUMERIC_KINDS = "biufc"

_log = logging.getLogger("pycollective.strategies.parameter_server")

_TOKEN_HINT = (
    "set PYCOLLECTIVE_TOKEN to the same secret on every task (e.g. export "
    "PYCOLLECTIVE_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')), "
    "or start the cluster with `pycollective run --ps N --workers M`, which makes one"
)


def resolve_token(token: str | None) -> str:
    """The cluster token: the argument, else PYCOLLECTIVE_TOKEN. ValueError without one."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ValueError(f"ParameterServerStrategy needs a cluster token: {_TOKEN_HINT}")
    if not token.isascii() or not token.isprintable():
        raise ValueError("the cluster token must be a printable ASCII string")
    return token


def payload_key(token: str) -> bytes:
    """The HMAC key of signed payloads, derived from the cluster token (so the token itself
    is never the MAC key of anything)."""
    return hmac.new(token.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((TOKEN_METADATA_KEY, token),)


# Tensors -----------------------------------------------------------------------------------------


def encode_tensor(array: Any) -> pb.Tensor:
    """A numpy array (or number) as a Tensor message (its bytes are copied once)."""
    arr = np.asarray(array)
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(
            f"only numeric tensors travel to and from parameter servers, got dtype {arr.dtype}"
        )
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return pb.Tensor(dtype=arr.dtype.str, shape=arr.shape, data=arr.tobytes())


def check_dtype(text: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise ValueError(f"tensor has an invalid dtype {text!r}") from None
    if dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype:
        raise ValueError(f"tensor dtype {text!r} is not a numeric dtype")
    return dtype


def decode_tensor(message: pb.Tensor, copy: bool = False) -> np.ndarray:
    """A Tensor message as a numpy array: a read-only view of the message bytes, or a
    writable copy with ``copy=True``. ValueError for anything malformed."""
    dtype = check_dtype(message.dtype)
    shape = tuple(int(d) for d in message.shape)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise ValueError(f"tensor has an invalid shape {shape}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dtype.itemsize != len(message.data):
        raise ValueError(
            f"tensor of shape {shape} and dtype {dtype} needs "
            f"{count * dtype.itemsize} bytes, the message has {len(message.data)}"
        )
    arr = np.frombuffer(message.data, dtype=dtype, count=count).reshape(shape)
    return arr.copy() if copy else arr


# Values (results of scheduled functions) ---------------------------------------------------------


def encode_value(obj: Any, where: str = "the return value") -> pb.Value:
    """A nest of tensors as a Value message. TypeError for anything else (the message says
    what to return instead)."""
    if obj is None:
        return pb.Value(none=True)
    if isinstance(obj, str):
        return pb.Value(text=obj)
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        items = [encode_value(x, where) for x in obj]
        box = pb.ValueList(items=items)
        return pb.Value(list=box) if isinstance(obj, list) else pb.Value(tuple=box)
    if isinstance(obj, dict):
        keys, values = [], []
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"{where}: dict keys must be strings to travel back, got {type(k).__name__}"
                )
            keys.append(k)
            values.append(encode_value(v, where))
        return pb.Value(dict=pb.ValueDict(keys=keys, values=values))
    if hasattr(obj, "_remote_read"):  # a variable handle: its value
        obj = obj._remote_read()
    if type(obj).__module__.startswith("torch") and hasattr(obj, "numpy"):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, (bool, int, float, complex, np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.kind in _NUMERIC_KINDS:
            return pb.Value(tensor=encode_tensor(arr))
    raise TypeError(
        f"{where} has a {type(obj).__name__}, which cannot travel back to the "
        "coordinator: return numpy arrays, numbers, strings or lists/tuples/dicts "
        "of them"
    )


def decode_value(message: pb.Value) -> Any:
    """A Value message as numpy arrays (0-d tensors become numpy scalars) in lists, tuples
    and dicts."""
    kind = message.WhichOneof("kind")
    if kind == "tensor":
        arr = decode_tensor(message.tensor, copy=True)
        return arr[()] if arr.ndim == 0 else arr
    if kind == "list":
        return [decode_value(x) for x in message.list.items]
    if kind == "tuple":
        return tuple(decode_value(x) for x in message.tuple.items)
    if kind == "dict":
        return {k: decode_value(v) for k, v in zip(message.dict.keys, message.dict.values)}
    if kind == "text":
        return message.text
    return None


# Signed payloads -----------------------------------------------------------------------------------


def _mac(key: bytes, kind: str, body: bytes, tensors: Any) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)

    def field(data: bytes) -> None:
        mac.update(len(data).to_bytes(8, "little"))
        mac.update(data)

    field(kind.encode("utf-8"))
    field(body)
    mac.update(len(tensors).to_bytes(8, "little"))
    for t in tensors:
        field(t.dtype.encode("utf-8"))
        field(np.asarray(list(t.shape), dtype="<i8").tobytes())
        field(t.data)
    return mac.digest()


def sign(
    key: bytes, kind: str, body: bytes, tensors: list[pb.Tensor] | None = None
) -> pb.SignedPayload:
    tensors = list(tensors or [])
    return pb.SignedPayload(
        kind=kind, body=body, tensors=tensors, mac=_mac(key, kind, body, tensors)
    )


def verify(key: bytes, payload: pb.SignedPayload, kind: str) -> bool:
    """Whether ``payload`` is an untampered payload of ``kind`` signed with ``key`` (constant-
    time comparison). Call it before unpickling anything."""
    if payload.kind != kind or len(payload.mac) != hashlib.sha256().digest_size:
        return False
    expected = _mac(key, payload.kind, payload.body, payload.tensors)
    return hmac.compare_digest(expected, payload.mac)


def serializer_name() -> str:
    return "cloudpickle" if _cloudpickle is not None else "pickle"


_BasePickler = _cloudpickle.Pickler if _cloudpickle is not None else pickle.Pickler


class _Pickler(_BasePickler):  # type: ignore[misc, valid-type]
    """Pulls numeric numpy arrays out into Tensor messages; ``hook(obj)`` may return a
    persistent id for other objects (variables, optimizers, iterators...)."""

    def __init__(self, file: io.BytesIO, hook: Callable[[Any], Any] | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._hook = hook
        self.tensors: list[pb.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if (
            type(obj) is np.ndarray
            and obj.dtype.kind in _NUMERIC_KINDS
            and obj.dtype.fields is None
        ):
            self.tensors.append(encode_tensor(obj))
            return ("tensor", len(self.tensors) - 1)
        if self._hook is not None:
            return self._hook(obj)
        return None


def dumps(obj: Any, hook: Callable[[Any], Any] | None = None) -> tuple[bytes, list[pb.Tensor]]:
    """Pickles ``obj`` (with cloudpickle when installed: functions of ``__main__`` travel by
    value; without it only importable module-level functions can be sent)."""
    buf = io.BytesIO()
    pickler = _Pickler(buf, hook)
    pickler.dump(obj)
    return buf.getvalue(), pickler.tensors


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: Any, load: Callable[[Any], Any] | None) -> None:
        super().__init__(file)
        self._tensors = tensors
        self._load = load

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "tensor":
            return decode_tensor(self._tensors[pid[1]], copy=True)
        if self._load is not None:
            return self._load(pid)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def loads(payload: pb.SignedPayload, load: Callable[[Any], Any] | None = None) -> Any:
    """Unpickles a payload that :func:`verify` accepted."""
    return _Unpickler(io.BytesIO(payload.body), payload.tensors, load).load()


# gRPC plumbing ---------------------------------------------------------------------------------------


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        # A restarted task is found again within about a second.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def server_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        # Two servers must never share a port silently.
        ("grpc.so_reuseport", 0),
    ]


def rpc_detail(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details}"
