"""Arrays that the other ranks on this host can map, and allreduce plans that use them.

``shared_empty(shape, dtype)`` returns an ordinary numpy array whose memory is an anonymous
shared-memory file (``memfd_create``) of this process. When every rank of a group on one host
prepares an allreduce (:meth:`ProcessGroup.prepare_allreduce`) whose input and output lie in
such arrays, each rank maps the others' arrays once, at preparation, and every call then runs
``direct``: rank r reads chunk r of every rank's input and writes the sum straight into every
rank's output. Each byte is read once and written once (the memory-traffic floor), where calls
on private buffers copy every byte into a shared ring and out of it again. (MPI's
``MPI_Win_allocate_shared`` and NCCL's registered buffers rest on the same idea.)

A peer's array is reached through ``/proc/<pid>/fd/<fd>`` of the process that made it, so the
ranks must see each other's processes (one host, one PID namespace, the same user); where they
do not, or where any rank's buffers are not shared arrays, the plan runs as it would have on
ordinary arrays. The memory lives as long as the array and every mapping of it: a peer's plan
keeps its mapping, so freeing an array never leaves another rank with a dangling one."""

from __future__ import annotations

import bisect
import hashlib
import mmap
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Fields per rank in the table the ranks exchange when they prepare a plan (int64 each): pid,
#: bytes of the call, then for the input and the output: fd, device, inode, file size, offset.
_FIELDS = 12


@dataclass(frozen=True)
class _Segment:
    """One shared array's file, as this process made it."""

    base: int  # address of the mapping here
    size: int  # bytes of the file and of the mapping
    fd: int
    device: int
    inode: int
    # None once the mapping is being freed: CPython unmaps an mmap (with the GIL released)
    # before the finalizer below forgets the segment, and meanwhile another thread may get the
    # same addresses for other memory. A dying object's weak reference already reads None.
    alive: weakref.ref[mmap.mmap]


# This process's segments by base address (sorted), for finding which one holds a buffer.
_bases: list[int] = []
_segments: dict[int, _Segment] = {}


def shared_empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A new, uninitialised numpy array in memory that other ranks on this host can map.

    Use it for the buffers of allreduce calls prepared once and run many times
    (``plan = group.prepare_allreduce(x, out=y)`` with ``x`` and ``y`` from here, on every
    rank): each call then reads and writes the peers' arrays directly instead of copying
    through shared-memory rings. Otherwise it is a plain array that the caller owns; its memory
    goes when the array (and every view of it) is gone."""
    if not hasattr(os, "memfd_create"):
        raise OSError("shared_empty needs Linux (memfd_create); use numpy arrays here")
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count < 0 or dt.hasobject:
        raise ValueError(
            f"shared_empty needs a non-negative shape and a plain dtype, got {shape!r} and {dt}"
        )
    size = max(mmap.PAGESIZE, -(-count * dt.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE)
    # The descriptor stays open while the array lives: peers open the file through it. (The
    # mmap object holds a duplicate of its own, which it does not expose before Python 3.13.)
    fd = os.memfd_create("pycollective-shared", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mem = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    array = np.frombuffer(mem, dtype=dt, count=count).reshape(shape)
    st = os.fstat(fd)
    base = int(np.frombuffer(mem, np.uint8, count=1).ctypes.data)
    bisect.insort(_bases, base)
    _segments[base] = _Segment(base, size, fd, st.st_dev, st.st_ino, weakref.ref(mem))
    weakref.finalize(mem, _forget, base, fd)
    return array


def _forget(base: int, fd: int) -> None:
    """The array's memory is gone here (peers' mappings keep their own reference)."""
    seg = _segments.get(base)
    if seg is not None and seg.fd == fd:  # not a newer array mapped at the same address
        del _segments[base]
    i = bisect.bisect_left(_bases, base)
    if i < len(_bases) and _bases[i] == base:
        del _bases[i]
    os.close(fd)


def _locate(address: int, nbytes: int) -> tuple[_Segment, int] | None:
    """The segment holding [address, address + nbytes) and the offset there, or None."""
    i = bisect.bisect_right(_bases, address) - 1
    try:  # a finalizer run by garbage collection may forget a segment between these two lines
        seg = _segments.get(_bases[i]) if i >= 0 else None
    except IndexError:
        seg = None
    if seg is None or seg.alive() is None:
        return None
    offset = address - seg.base
    return (seg, offset) if offset + nbytes <= seg.size else None


def holds(array: np.ndarray) -> bool:
    """Whether the array's memory lies in one of this process's shared arrays."""
    return _locate(array.ctypes.data, array.nbytes) is not None


def describe(in_address: int, out_address: int, nbytes: int) -> np.ndarray:
    """This rank's row of the table exchanged at preparation: where its input and output live,
    or zeros (pid 0) when either is not in a shared array."""
    row = np.zeros(_FIELDS, np.int64)
    places = [_locate(in_address, nbytes), _locate(out_address, nbytes)]
    if nbytes == 0 or None in places:
        return row
    row[0], row[1] = os.getpid(), nbytes
    for i, (seg, offset) in enumerate(places):  # type: ignore[misc]
        row[2 + 5 * i : 7 + 5 * i] = (seg.fd, seg.device, seg.inode, seg.size, offset)
    return row


class PeerMappings:
    """Every group rank's input and output of one plan, mapped into this process (this rank's
    own at their addresses); holds the mappings while the plan lives."""

    def __init__(self, table: np.ndarray, rank: int, own: tuple[int, int]) -> None:
        self._maps: dict[tuple[int, ...], mmap.mmap] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        for r, row in enumerate(table):
            if r == rank:
                self.inputs.append(own[0])
                self.outputs.append(own[1])
                continue
            pid = int(row[0])
            self.inputs.append(self._address(pid, row[2:7]))
            self.outputs.append(self._address(pid, row[7:12]))
        # The same on every rank that paired the same plans: checked at every call's entry.
        self.key = int.from_bytes(
            hashlib.blake2b(table.tobytes(), digest_size=8).digest(), "little"
        )

    def _address(self, pid: int, place: np.ndarray) -> int:
        fd, device, inode, size, offset = (int(v) for v in place)
        key = (pid, fd, device, inode, size)
        mem = self._maps.get(key)
        if mem is None:
            mem = _peer_maps.get(key)
        if mem is None:
            mem = _map_peer(*key)
            _peer_maps[key] = mem
        self._maps[key] = mem
        return int(np.frombuffer(mem, np.uint8, count=1).ctypes.data) + offset


# Peers' arrays mapped here, shared by every plan that uses them while any of them lives: each
# mapping holds a file descriptor, and a training loop may prepare a plan per gradient bucket.
_peer_maps: weakref.WeakValueDictionary[tuple[int, ...], mmap.mmap] = weakref.WeakValueDictionary()


def _map_peer(pid: int, fd: int, device: int, inode: int, size: int) -> mmap.mmap:
    """Maps another process's shared array; OSError when it cannot be reached from here."""
    peer_fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(peer_fd)
        if (st.st_dev, st.st_ino) != (device, inode) or st.st_size < size:
            # Another host's pid, or the array was freed and the number reused.
            raise OSError(f"/proc/{pid}/fd/{fd} is not the shared array the peer described")
        return mmap.mmap(peer_fd, size)
    finally:
        os.close(peer_fd)
