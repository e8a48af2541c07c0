"""How a request or reply of the parameter-server data plane travels over a native channel
(pycollective.channel): a fixed-size lead frame, then the bytes of each large tensor as a frame
of its own, straight from the sender's array into the receiver's.

The lead frame (``BLOCK`` bytes) holds ``[header length, inline length]``, the header (a
DataRequest or DataReply whose tensors carry dtype and shape only) and, packed after it, the
bytes of the first tensors while they add up to at most ``INLINE_BYTES`` (a small model's whole
step fits in one frame each way). What does not fit in the lead frame follows in one more
frame. Every frame carries a tag (checked by the receiver) naming its place in the message.

The lead frames travel on the channel's socket (they wake a server waiting for the next
request); the large tensors' frames are bulk messages, through shared memory when the channel
has it (pycollective.channel.Channel.use_shared_memory).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from pycollective.channel import Channel

#: bytes of the lead frame of every message
BLOCK = 8 << 10
#: the first tensors of a message travel packed after its header while their bytes add up to
#: at most this many
INLINE_BYTES = 64 << 10
#: the largest header a receiver accepts
MAX_HEADER_BYTES = 64 << 20
_LEAD = struct.Struct("<II")  # header bytes, inline tensor bytes
_TAG_LEAD, _TAG_REST, _TAG_TENSOR = 1, 2, 16


class FrameError(ValueError):
    """A message whose frames contradict each other (a corrupt or hostile sender)."""


def byte_view(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 array (sharing memory)."""
    if not array.flags.c_contiguous:
        raise ValueError("the data plane moves C-contiguous arrays, got a strided one")
    return array.reshape(-1).view(np.uint8)


def send_message(
    channel: Channel, block: np.ndarray, header: Any, arrays: Sequence[np.ndarray]
) -> None:
    """Sends ``header`` (a protobuf message) and the bytes of ``arrays`` (C-contiguous, in the
    order of the header's tensors). ``block`` is the sender's BLOCK-byte scratch frame."""
    head = header.SerializeToString()
    inline, packed = 0, 0
    for a in arrays:
        if packed + a.nbytes > INLINE_BYTES:
            break
        packed += a.nbytes
        inline += 1
    length = _LEAD.size + len(head) + packed
    frame = block if length <= BLOCK else np.empty(length, np.uint8)
    _LEAD.pack_into(frame.data, 0, len(head), packed)
    at = _LEAD.size
    frame[at : at + len(head)] = np.frombuffer(head, np.uint8)
    at += len(head)
    for a in arrays[:inline]:
        frame[at : at + a.nbytes] = byte_view(a)
        at += a.nbytes
    channel.send(frame[:BLOCK] if length > BLOCK else block, _TAG_LEAD)
    if length > BLOCK:
        channel.send(frame[BLOCK:length], _TAG_REST)
    for index in range(inline, len(arrays)):
        channel.send(arrays[index], _TAG_TENSOR + index, bulk=True)


def receive_header(
    channel: Channel, block: np.ndarray, message_type: Any, timeout: float | None = None
) -> tuple[Any, np.ndarray]:
    """Receives the lead of a message: its header (parsed as ``message_type``) and the packed
    bytes of its first tensors (a copy when they arrived in ``block``, which the next message
    reuses). Then call :func:`receive_tensors`."""
    channel.recv(block, _TAG_LEAD, timeout)
    head_len, packed = _LEAD.unpack_from(block.data)
    if head_len > MAX_HEADER_BYTES or packed > INLINE_BYTES:
        raise FrameError(
            f"a message announced a {head_len}-byte header and {packed} inline bytes "
            f"(at most {MAX_HEADER_BYTES} and {INLINE_BYTES})"
        )
    length = _LEAD.size + head_len + packed
    frame = block
    if length > BLOCK:
        frame = np.empty(length, np.uint8)
        frame[:BLOCK] = block
        channel.recv(frame[BLOCK:], _TAG_REST, timeout)
    try:
        header = message_type.FromString(frame[_LEAD.size : _LEAD.size + head_len].tobytes())
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise FrameError(f"a message header does not parse ({exc})") from None
    inline = frame[_LEAD.size + head_len : length]
    return header, (inline.copy() if frame is block else inline)


def receive_tensors(
    channel: Channel,
    inline: np.ndarray,
    outs: Sequence[np.ndarray],
    timeout: float | None = None,
) -> None:
    """Receives a message's tensors into ``outs`` (C-contiguous, sized from its header): the
    first from the packed ``inline`` bytes, the rest as frames."""
    at, index = 0, 0
    while index < len(outs) and at < inline.size:
        view = byte_view(outs[index])
        if at + view.size > inline.size:
            raise FrameError(
                f"tensor {index} needs {view.size} bytes, the message packed only "
                f"{inline.size - at} more"
            )
        view[:] = inline[at : at + view.size]
        at += view.size
        index += 1
    if at != inline.size:
        raise FrameError(f"a message packed {inline.size} bytes, its tensors hold {at}")
    for i in range(index, len(outs)):
        channel.recv(outs[i], _TAG_TENSOR + i, timeout, bulk=True)
