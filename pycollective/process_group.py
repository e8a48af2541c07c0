"""Process groups: every process calls the same collectives; links between processes are
shared memory (same host) or TCP (any host), set up through the gRPC coordination service.

    import pycollective as pc
    pc.init()                                   # from arguments or the launcher's environment
    y = pc.allreduce(x, op="sum", algo="ring")
    pc.shutdown()

The module-level functions act on the default group made by :func:`init`; :func:`new_group`
makes sub-groups of it.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import secrets
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycollective import _exchange, affinity, config, cost_model, log, shared_memory, tuning
from pycollective._call_memo import CallMemo
from pycollective._calls import KINDS, Prepared, call_spec, check_avg, prepare, wire_code
from pycollective._ext import _C
from pycollective.config import default_timeout, env_float, env_int
from pycollective.device import is_device_tensor
from pycollective.errors import Aborted, CollectiveError, CollectiveTimeout, RemoteError
from pycollective.reduce_op import ReduceOp, parse_op
from pycollective.rendezvous import ClusterSpec, elastic, rendezvous
from pycollective.rendezvous.job_file import SameHostJob
from pycollective.tensors import adapt, shape_hash
from pycollective.transports import (
    TcpListener,
    bind_address,
    connect_host_segment,
    open_links,
)

_FLOAT32 = _C.enum_codes()["dtype"]["float32"]
# How long the coordinator host's service keeps serving once it stops: when a rank dies, the
# abort notice naming it is still on its way to the survivors as the coordinator host raises and
# exits; a grace of 0 cancels those calls, and a survivor's error would name only the lost
# coordinator instead of the rank that failed.
_NOTICE_GRACE_S = 0.5
_log = logging.getLogger(__name__)


class Work:
    """Handle of an asynchronous collective (``*_async``).

    ``wait(timeout=None)`` returns the result (re-raising the collective's error);
    ``is_completed()`` polls. The inputs must stay untouched until it completes. Dropping the
    Work early is safe: the group holds the call's own buffers until the call is done.
    """

    def __init__(self, native: Any, calls: list[Any], group: ProcessGroup, what: str):
        self._native, self._calls, self._group, self._what = native, calls, group, what
        group._world.keep_until_done(native, calls)

    def is_completed(self) -> bool:
        return self._native.is_completed()

    def wait(self, timeout: float | None = None) -> Any:
        try:
            done = self._native.wait(-1.0 if timeout is None else float(timeout))
        except CollectiveError as exc:
            raise self._group._world.explain_failure(exc) from None
        if not done:
            raise CollectiveTimeout(
                f"[rank {self._group.rank}/{self._group.size}] {self._what} "
                f"still running after wait(timeout={timeout}); it goes on "
                "in the background"
            )
        results = [c.result() for c in self._calls]
        if not results:  # a barrier
            return None
        return results[0] if len(results) == 1 else results

    @property
    def seconds(self) -> float:
        """How long the collective ran (once completed)."""
        return self._native.seconds


class PreparedCall(_C.PreparedCallBase):
    """A collective prepared once (:func:`prepare_allreduce`): calling it runs the collective
    on the buffers it was prepared with and returns the result (the same object every time).
    The call itself is native (``_C.PreparedCallBase``): no Python runs between ``plan()`` and
    the collective, and a failure is explained as a plain call's is."""

    __slots__ = ("_native", "_call", "_group", "_peers")

    def __init__(
        self,
        native: Any,
        call: Prepared,
        group: ProcessGroup,
        peers: shared_memory.PeerMappings | None = None,
    ) -> None:
        super().__init__(native, call.result(), group._world.explain_failure)
        self._native, self._call, self._group = native, call, group  # keeps the buffers alive
        self._peers = peers  # the peers' shared arrays, mapped for as long as the plan lives

    @property
    def algorithm(self) -> str:
        """The algorithm the next call runs (``auto``'s choice; where auto times this call's
        rivals, its current one)."""
        name = str(self._native.algorithm)
        return name if self._peers is None else f"{name} (shared arrays)"

    def __repr__(self) -> str:
        return f"PreparedCall({self._group._where}: allreduce with {self.algorithm})"


class ProcessGroup:
    """A set of ranks that run collectives together. Made by :func:`init` (all ranks) and
    :func:`new_group` (a subset). Ranks passed to collectives (``root=``) are ranks within the
    group."""

    def __init__(self, world: _World, members: list[int], group_id: int):
        self._world = world
        self.members = members
        self.group_id = group_id
        self._native_members = _C.Members(ranks=members, group_id=group_id)
        me = world.comm.rank
        self.rank = members.index(me)
        self.size = len(members)
        self._where = f"rank {me}"  # names this rank in argument errors
        self._where_out = f"rank {me} out="
        self._memo = CallMemo(self._native_members)  # calls checked (_call_memo.py)
        # barrier()'s spec per timeout: a training or benchmark loop calls it with the same
        # arguments every time, and building the spec cost as much as the barrier itself.
        self._barrier_specs: dict[float, Any] = {}
        self._default_barrier = self._barrier_spec(None)  # read by barrier() without a call

    def __repr__(self) -> str:
        return f"ProcessGroup(rank={self.rank}, size={self.size}, members={self.members})"

    # Collectives: each returns the result; *_async returns a Work.

    def allreduce(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> Any:
        """Every rank gets the reduction of all ranks' tensors.

        ``compress="bf16"`` (or ``"fp16"``), for float32 tensors: values cross network links
        (tcp, grpc) as 16 bits and are accumulated in float32 -- half the bytes on slow links.
        Every rank's result is rounded alike to that 16-bit precision (docs/compression.md)."""
        # The plain call, remembered, runs without a memo key (CallMemo.plain_out/plain_new);
        # the module's allreduce() runs it for the default group without entering this frame.
        if op == "sum" and algo == "auto" and not inplace and timeout is None and compress is None:
            layouts = self._memo.plain_out if out is not None else self._memo.plain_new
            if layouts is not None:
                result = self._run_known(layouts, x, out)
                if result is not NotImplemented:
                    return result
        return self._run("allreduce", x, op, algo, 0, inplace, out, timeout, compress=compress)

    def prepare_allreduce(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> PreparedCall:
        """``allreduce`` prepared once, to run many times on the same buffers (like MPI's
        persistent collectives): ``plan = group.prepare_allreduce(x, out=y)``, then ``plan()``
        runs it and returns the result. Every check, the output and ``auto``'s first choice are
        made here; each call is the collective alone. Where ``auto`` times a call's near rivals
        (calls it prices at 5 us and more), the plan goes on timing them as a plain call does,
        so that a choice the cost model got wrong on this machine moves (``plan.algorithm``
        says what runs now). Every rank prepares the same calls in the same order; between
        calls, change the contents of ``x``, never the array itself. Host tensors only.

        When the group's ranks share one host and every rank's ``x`` and ``out`` are
        :func:`pycollective.shared_empty` arrays, the ranks map each other's arrays here and
        each call reads and writes them directly (``plan.algorithm`` is then
        ``"direct (shared arrays)"``). To find out, a group of one host over shared memory
        swaps a few bytes when it prepares with ``algo="direct"``, or with ``"auto"`` where
        ``auto`` would not run the host slots: preparing is then a collective of the group,
        like the calls."""
        if type(x).__module__ != "numpy" and is_device_tensor(x):
            raise TypeError(f"{self._where}: prepare_allreduce takes host tensors")
        call, spec = self._host_call("allreduce", x, op, algo, 0, inplace, out, timeout, compress)
        if out is None and not inplace and shared_memory.holds(call.inp):
            # The result of a plan on a shared array is one too, so that the plan can use both.
            result = shared_memory.shared_empty(call.inp.shape, call.inp.dtype)
            call = Prepared(call.inp, result, call.buf)
        comm, members = self._world.comm, self._native_members
        try:
            # direct runs between processes on shared arrays only: its plan is made once they
            # are mapped, or fails with direct's reason below.
            native = None if algo == "direct" else comm.prepare(spec, members, call.inp, call.out)
            # auto keeps the host segment's slots where they serve the call: one write and one
            # wait beat direct's two rounds of messages (2 ranks, plans back to back: slots
            # 1.9-3.2 us at 8 B-8 KiB, direct on shared arrays 3.3-3.75 us; 4 ranks at 16 KiB
            # 4.8 against 6.7). Past the slots, direct wins (4 ranks at 32 KiB: 6.9 us against
            # halving-doubling's 10.9).
            eligible = compress is None and (
                native is None or (algo == "auto" and native.algorithm != "slots")
            )
            peers, why_not = self._map_shared_arrays(call, timeout) if eligible else (None, "")
            if peers is not None:
                native = comm.prepare_mapped(
                    spec, members, call.inp, call.out, peers.inputs, peers.outputs, peers.key
                )
            elif native is None and why_not:
                raise ValueError(
                    f"{self._where}: algo='direct' between processes runs on shared arrays, "
                    f"and {why_not}"
                )
            elif native is None:  # not one host over shared memory: direct's own reason
                native = comm.prepare(spec, members, call.inp, call.out)
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None
        return PreparedCall(native, call, self, peers)

    def _map_shared_arrays(
        self, call: Prepared, timeout: float | None
    ) -> tuple[shared_memory.PeerMappings | None, str]:
        """For a plan on one host: the ranks swap where their buffers are, and map each
        other's when all of them are shared arrays (shared_memory.py). Returns the mappings,
        or None and why not ("" where the group is not one host over shared memory, and no
        rank exchanged anything). The same answer on every rank."""
        world = self._world
        links = {world.transports[m] for m in self.members if m != world.spec.rank}
        if links != {"shm"}:
            return None, ""  # every rank of the group sees the same links
        assert call.out is not None  # an allreduce has a result on every rank
        addresses = (call.inp.ctypes.data, call.out.ctypes.data)
        row = shared_memory.describe(*addresses, call.inp.nbytes)
        table = self.allgather(row, timeout=timeout).reshape(self.size, -1)
        private = [self.members[r] for r in range(self.size) if table[r, 0] == 0]
        if private:
            return None, (
                f"the input or output of rank(s) {private} is not a pycollective.shared_empty array"
            )
        if not (table[:, 1] == table[0, 1]).all():
            return None, "the ranks prepared calls of different sizes"
        peers = None
        try:
            peers = shared_memory.PeerMappings(table, self.rank, addresses)
        except OSError as exc:
            _log.warning(
                "%s: cannot map a peer's shared array (%s); no rank's plan runs on shared arrays",
                self._where,
                exc,
            )
        mapped = self.allgather(np.array([peers is not None], np.int32), timeout=timeout)
        failed = [self.members[r] for r in range(self.size) if not mapped[r, 0]]
        if failed:
            return None, (
                f"rank(s) {failed} could not map a peer's shared array (their log says why: "
                "the ranks must see each other's processes, on one host, in one PID namespace)"
            )
        return peers, ""

    def allreduce_async(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> Work:
        """Starts an allreduce on the group's worker thread; ``.wait()`` gives the result."""
        return self._run(
            "allreduce", x, op, algo, 0, inplace, out, timeout, asynchronous=True, compress=compress
        )

    def reduce_scatter_async(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        out: Any = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> Work:
        """:meth:`reduce_scatter` on the group's worker thread."""
        return self._run(
            "reduce_scatter",
            x,
            op,
            algo,
            0,
            False,
            out,
            timeout,
            asynchronous=True,
            compress=compress,
        )

    def allgather_async(
        self, x: Any, algo: str = "auto", out: Any = None, timeout: float | None = None
    ) -> Work:
        """:meth:`allgather` on the group's worker thread."""
        return self._run("allgather", x, "sum", algo, 0, False, out, timeout, asynchronous=True)

    def broadcast_async(
        self,
        x: Any,
        root: int = 0,
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
    ) -> Work:
        """:meth:`broadcast` on the group's worker thread."""
        return self._run(
            "broadcast", x, "sum", algo, root, inplace, out, timeout, asynchronous=True
        )

    def reduce_async(
        self,
        x: Any,
        root: int = 0,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
    ) -> Work:
        """:meth:`reduce` on the group's worker thread."""
        return self._run("reduce", x, op, algo, root, inplace, out, timeout, asynchronous=True)

    def reduce_scatter(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        out: Any = None,
        timeout: float | None = None,
        compress: str | None = None,
    ) -> Any:
        """Rank r gets chunk r of the reduction (rows of axis 0 when it divides evenly).
        ``compress=``: as in :meth:`allreduce`."""
        return self._run("reduce_scatter", x, op, algo, 0, False, out, timeout, compress=compress)

    def allgather(
        self, x: Any, algo: str = "auto", out: Any = None, timeout: float | None = None
    ) -> Any:
        """Every rank gets all ranks' tensors stacked: shape (size, *x.shape)."""
        return self._run("allgather", x, "sum", algo, 0, False, out, timeout)

    def broadcast(
        self,
        x: Any,
        root: int = 0,
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Every rank gets rank ``root``'s tensor (others pass a tensor of the same shape)."""
        return self._run("broadcast", x, "sum", algo, root, inplace, out, timeout)

    def reduce(
        self,
        x: Any,
        root: int = 0,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Rank ``root`` gets the reduction; other ranks get None."""
        return self._run("reduce", x, op, algo, root, inplace, out, timeout)

    def alltoall(
        self,
        x: Any,
        out: Any = None,
        send_counts: Sequence[int] | None = None,
        recv_counts: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Rank r's block p goes to rank p; rank r gets block r of every rank, in rank order.

        ``x`` is split along axis 0, evenly or into ``send_counts`` rows per rank; the result
        (``out``, or a new tensor) holds ``recv_counts`` rows from each rank (default: an even
        split). Lists work too: ``x[p]`` goes to rank p, ``out[p]`` receives from rank p.
        Every block moves straight between the ranks' buffers (pairwise exchange)."""
        return self._exchange(
            _exchange.alltoall(x, out, send_counts, recv_counts, self.size, self._where), 0, timeout
        )

    def alltoall_async(
        self,
        x: Any,
        out: Any = None,
        send_counts: Sequence[int] | None = None,
        recv_counts: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> Work:
        """:meth:`alltoall` on the group's worker thread; ``.wait()`` gives the result."""
        return self._exchange(
            _exchange.alltoall(x, out, send_counts, recv_counts, self.size, self._where),
            0,
            timeout,
            asynchronous=True,
        )

    def gather(
        self,
        x: Any,
        root: int = 0,
        out: Any = None,
        timeout: float | None = None,
        asynchronous: bool = False,
    ) -> Any:
        """Rank ``root`` gets every rank's tensor: stacked, shape (size, *x.shape), or into
        ``out`` (one such tensor, or a list of ``size`` tensors). Other ranks get None."""
        root = self._check_root(root)
        return self._exchange(
            _exchange.gather(x, root, out, self.rank, self.size, self._where),
            root,
            timeout,
            asynchronous,
        )

    def scatter(
        self,
        x: Any,
        out: Any,
        root: int = 0,
        timeout: float | None = None,
        asynchronous: bool = False,
    ) -> Any:
        """Rank p's ``out`` gets the root's ``x[p]`` (``x``: a list of ``size`` tensors or one
        tensor whose axis 0 has length size; ignored, may be None, on other ranks)."""
        root = self._check_root(root)
        return self._exchange(
            _exchange.scatter(x, root, out, self.rank, self.size, self._where),
            root,
            timeout,
            asynchronous,
        )

    def send(
        self,
        x: Any,
        dst: int,
        tag: int = 0,
        timeout: float | None = None,
        asynchronous: bool = False,
    ) -> Any:
        """Sends ``x`` to group rank ``dst``, which calls :meth:`recv` with the same shape, dtype
        and tag. Point-to-point calls between two ranks match in the order they were made."""
        return self._point_to_point(x, dst, True, tag, timeout, asynchronous)

    def recv(
        self,
        x: Any,
        src: int,
        tag: int = 0,
        timeout: float | None = None,
        asynchronous: bool = False,
    ) -> Any:
        """Receives into ``x`` (contiguous, writable) what group rank ``src`` sent; returns x."""
        return self._point_to_point(x, src, False, tag, timeout, asynchronous)

    def barrier(self, timeout: float | None = None) -> None:
        """Returns once every rank of the group called barrier()."""
        spec = self._default_barrier if timeout is None else self._barrier_spec(timeout)
        # _run_native's error path written out, as _run's remembered-call path does: a barrier
        # takes about a microsecond, so it makes one Python call fewer.
        try:
            self._world.comm.run(spec, self._native_members, None, None)
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None

    def barrier_async(self, timeout: float | None = None) -> Work:
        """:meth:`barrier` queued behind this rank's earlier calls; ``wait()`` returns None
        once every rank of the group reached it (by either method)."""
        native = self._world.comm.submit(
            self._barrier_spec(timeout), self._native_members, None, None
        )
        return Work(native, [], self, "barrier")

    def _barrier_spec(self, timeout: float | None) -> Any:
        seconds = self._timeout(timeout)
        spec = self._barrier_specs.get(seconds)
        if spec is None:
            spec = call_spec(KINDS["barrier"], 0, _FLOAT32, 0, 0, "auto", 0, seconds)
            self._barrier_specs[seconds] = spec
        return spec

    @property
    def auto_trial_calls(self) -> int:
        """The most calls of one shape ``algo="auto"`` spends on its first trial, where the model
        prices a near tie (calls of 5 us and more, or of any price where the host's ranks
        outnumber its cores); 0 with ``PYCOLLECTIVE_AUTO_TRIALS=0``."""
        return self._world.comm.auto_trial_calls

    def explain(self, collective: str, nbytes: int) -> str:
        """The algorithm algo="auto" runs for a float32 call of this size, and why: where calls
        of this shape are measured (a near tie in the model's prices at 5 us or more, or one
        algorithm alone whose calls are watched, priced at 20 us or more; any price where the
        host's ranks outnumber its cores) and have run, the times every rank agreed on; else the
        model's pick and costs."""
        return self._world.comm.explain(
            _C.CallSpec(kind=KINDS[collective], count=nbytes // 4, dtype=_FLOAT32),
            self._native_members,
        )

    def _timeout(self, timeout: float | None) -> float:
        return self._world.timeout if timeout is None else float(timeout)

    def _run_native(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """``fn(*args, **kwargs)``: a native collective of this group, a failure explained."""
        try:
            fn(*args, **kwargs)
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None

    def _run_known(self, layouts: Any, x: Any, out: Any) -> Any:
        """A remembered call's result (``KnownLayouts.run``), or NotImplemented when (x, out)
        has no known layout."""
        try:
            return layouts.run(self._world.comm, x, out)
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None

    def _run(
        self,
        kind: str,
        x: Any,
        op: str | ReduceOp,
        algo: str,
        root: int,
        inplace: bool,
        out: Any,
        timeout: float | None,
        asynchronous: bool = False,
        compress: str | None = None,
    ) -> Any:
        memo_key = None
        if not asynchronous:
            # A call checked before runs from here (_call_memo.py). Written out rather than
            # through CallMemo's methods: a small call costs about a microsecond, and each
            # Python call on this path added a tenth of it.
            # The key: the scalar arguments. The types of op and root are part of it: op=0
            # equals ReduceOp.SUM and root=1.0 equals 1, but the full path refuses them.
            memo_key = (
                kind, type(op), op, algo, type(root), root, inplace, out is None, timeout, compress
            )  # fmt: skip
            try:
                layouts = self._memo.get(memo_key)
            except TypeError:  # an unhashable argument: the full path reports what is wrong
                layouts = memo_key = None
            if layouts is not None:
                result = self._run_known(layouts, x, out)
                if result is not NotImplemented:
                    return result
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank of the group in [0, {self.size}), got {root!r}")
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a string, got {type(algo).__name__}")
        reduce_op = parse_op(op)
        if algo == "nccl" or (type(x).__module__ != "numpy" and is_device_tensor(x)):
            if compress is not None:
                raise ValueError(
                    f"{self._where}: compress={compress!r} applies to host tensors on "
                    "pycollective's own links; NCCL moves device tensors as they are: drop compress="
                )
            return self._run_nccl(kind, x, reduce_op, algo, root, inplace, out, asynchronous)
        call, spec = self._host_call(
            kind, x, reduce_op, algo, root, inplace, out, timeout, compress
        )
        comm = self._world.comm
        if asynchronous:
            return Work(
                comm.submit(spec, self._native_members, call.inp, call.out),
                [call],
                self,
                f"{kind} of {call.buf.count} {call.buf.dtype_name}",
            )
        self._run_native(comm.run, spec, self._native_members, call.inp, call.out)
        if memo_key is not None:
            self._memo.remember(memo_key, x, call, out, inplace, spec)
        return call.result()

    def _host_call(
        self,
        kind: str,
        x: Any,
        op: str | ReduceOp,
        algo: str,
        root: int,
        inplace: bool,
        out: Any,
        timeout: float | None,
        compress: str | None = None,
    ) -> tuple[Prepared, Any]:
        """This rank's checked buffers for a call of host tensors and its native CallSpec."""
        reduce_op = parse_op(op)
        where = self._where
        buf = adapt(x, where)
        check_avg(kind, reduce_op, buf.code, where)
        call = prepare(
            kind,
            buf,
            self.rank,
            self.size,
            root,
            inplace,
            where,
            None if out is None else adapt(out, self._where_out),
        )
        spec = call_spec(
            KINDS[kind],
            call.inp.size,
            buf.code,
            reduce_op.value,
            root,
            algo,
            shape_hash(call.inp.shape),
            self._world.timeout if timeout is None else float(timeout),
            wire_code(compress, where),
        )
        return call, spec

    def _check_root(self, root: int) -> int:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank of the group in [0, {self.size}), got {root!r}")
        return root

    def _point_to_point(
        self, x: Any, peer: int, sending: bool, tag: int, timeout: float | None, asynchronous: bool
    ) -> Any:
        what = "dst" if sending else "src"
        if not isinstance(peer, int) or not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(
                f"{self._where}: {what} must be another rank of the group in "
                f"[0, {self.size}), got {peer!r}"
            )
        me, other = self.members[self.rank], self.members[peer]
        pair = sorted((me, other))
        ex = _exchange.point_to_point(x, sending, tag, pair.index(other), self._where)
        # The two ranks form a group of their own, one per direction: its sequence numbers
        # count only the messages from this sender to this receiver, so sends and receives
        # each side issues in either order still pair up, whatever else runs meanwhile.
        source, dest = (me, other) if sending else (other, me)
        return self._exchange(
            ex, pair.index(source), timeout, asynchronous, _direction(source, dest)
        )

    def _exchange(
        self,
        ex: _exchange.Exchange,
        root: int,
        timeout: float | None,
        asynchronous: bool = False,
        members: Any = None,
    ) -> Any:
        """Runs a pairwise collective (csrc/algorithms/pairwise.cc) on this group, or on the
        pair ``members`` (a ``_C.Members``: send/recv)."""
        # The spec's algorithm is not used: pairwise collectives run the pairwise schedule.
        spec = call_spec(
            _exchange.KINDS[ex.kind],
            ex.count,
            ex.code,
            0,
            root,
            "auto",
            ex.shape_hash,
            self._timeout(timeout),
        )
        group = self._native_members if members is None else members
        run = self._world.comm.exchange
        if asynchronous:
            return Work(
                run(spec, group, sends=ex.sends, recvs=ex.recvs, asynchronous=True),
                [ex],
                self,
                f"{ex.kind} of {ex.count} elements",
            )
        self._run_native(run, spec, group, sends=ex.sends, recvs=ex.recvs, asynchronous=False)
        return ex.result()

    def _run_nccl(
        self,
        kind: str,
        x: Any,
        reduce_op: ReduceOp,
        algo: str,
        root: int,
        inplace: bool,
        out: Any,
        asynchronous: bool,
    ) -> Any:
        """Device tensors run over NCCL (one communicator per group and device, its unique id
        passed through the coordination service), enqueued on the tensor's current stream:
        the result is ready in stream order when this returns."""
        from pycollective import nccl
        from pycollective.device import adapt_device, prepare_device

        where = self._where
        if algo not in ("nccl", "auto"):
            raise TypeError(
                f"{where}: device tensors in a process group run over NCCL: use "
                f"algo='nccl' (or 'auto'); algo={algo!r} needs host memory (copy "
                "the tensor to the host first)"
            )
        buf = adapt_device(x, where)
        nccl.check_call(kind, buf, reduce_op, self.size, where)
        call = prepare_device(
            kind,
            buf,
            self.rank,
            self.size,
            root,
            inplace,
            where,
            None if out is None else adapt_device(out, f"{where} out="),
        )
        try:
            comm = nccl.group_communicator(self, buf.device)
            nccl.enqueue(comm, kind, call.inp, call.out, reduce_op, root, call.inp.stream)
        except CollectiveError as exc:
            raise self._world.explain_failure(exc) from None
        if asynchronous:
            return nccl.NcclWork(comm, call.result(), f"{kind} of {buf.count} {buf.dtype_name}")
        return call.result()


@dataclass(frozen=True)
class _LinkSetup:
    """What opening links to the peers takes, kept for connect_again()."""

    token: str
    session: str
    hosts: list[str]
    forced: str | None
    ifname: str | None
    connect_timeout: float
    shm_ring_bytes: int


class _World:
    """Everything :func:`init` set up: the native communicator, the coordination client (and
    service on rank 0), and what the coordinator said when a rank failed."""

    def __init__(
        self,
        spec: ClusterSpec,
        timeout: float,
        transport: str | None,
        ifname: str | None,
        connect_timeout: float,
        announce: Callable[[str], None] | None = None,
    ):
        self.spec = spec
        self.timeout = timeout
        self.groups = 0
        self.link_sets = 0  # connect_again() calls so far (names each set's connections)
        self.abort_notice: tuple[int, str] | None = None
        self._notice = threading.Event()
        self._reported = False
        # Asynchronous calls' buffers (Work._calls), held until the call completes: the worker
        # thread reads and writes them through raw pointers, and a Work dropped early (after a
        # timed-out wait, say) must not free its output or input copy under it.
        self._in_flight: deque[tuple[Any, list[Any]]] = deque()
        self._in_flight_lock = threading.Lock()  # calls may be started from several threads
        self._abort_callbacks: list[Callable[[str], None]] = []
        listener = TcpListener.open(ifname, spec.master_addr)
        forced = transport or config.text("PYCOLLECTIVE_TRANSPORT") or None
        token = spec.token or secrets.token_hex(16)
        endpoints = {"tcp": listener.endpoint}
        self.grpc_plane = None
        try:
            if forced == "grpc":
                from pycollective.grpc_transport import GrpcDataPlane

                host = listener.endpoint.rsplit(":", 1)[0]
                self.grpc_plane = GrpcDataPlane(
                    spec.rank, token, bind_address(ifname, spec.master_addr), host, connect_timeout
                )
                endpoints["grpc"] = self.grpc_plane.endpoint
            self.client, peers, self.service = rendezvous(
                spec,
                endpoints,
                connect_timeout,
                heartbeat_timeout=config.heartbeat_timeout(),
                announce=announce,
            )
            try:
                hosts = [p.host_id for p in peers]
                self._link_setup = _LinkSetup(
                    token=token,
                    session=self._session(spec.rank, connect_timeout),
                    hosts=hosts,
                    forced=forced,
                    ifname=ifname,
                    connect_timeout=connect_timeout,
                    shm_ring_bytes=env_int("PYCOLLECTIVE_SHM_RING_BYTES", 4 << 20),
                )
                links, self.transports = self._open_links(
                    listener, [p.endpoints for p in peers], "", self.grpc_plane
                )
                host_index = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
                self.host_of = [host_index[h] for h in hosts]
                self.comm = _C.Communicator(
                    rank=spec.rank,
                    size=spec.world_size,
                    links=links,
                    host_of=self.host_of,
                    timeout=timeout,
                )
                connect_host_segment(
                    self.comm,
                    spec.rank,
                    self.transports,
                    self._link_setup.session,
                    token,
                    connect_timeout,
                )
                self._set_costs()
                self.local_ranks = [p.rank for p in peers if p.host_id == hosts[spec.rank]]
                self._cpus_before = affinity.spread_over_cores(
                    spec.rank, self.local_ranks.index(spec.rank), len(self.local_ranks)
                )
            except BaseException:
                self.client.close()
                if self.service is not None:
                    self.service.stop(grace=0)
                raise
        except BaseException:
            if self.grpc_plane is not None:
                self.grpc_plane.close()
            raise
        finally:
            listener.close()
        self.client.start_heartbeat(self._on_abort)
        self.world = ProcessGroup(self, list(range(spec.world_size)), 0)
        # No rank leaves init before every rank is done with the coordinator: rank 0 serves it
        # from Python threads, and whatever rank 0 runs next while holding the GIL (mpi4py's
        # MPI_Init waits there for every rank to reach it) would stall the others' last steps
        # of init. Measured under `mpirun -n 4`: `pc.init()` then `import mpi4py` failed 5 of 8
        # times with "did not open the abort watch within 10 s". The coordinator's barrier, not
        # the group's: the group's first collective stays number 0 in every message.
        # The barrier alone still left a window: rank 0 leaves it as soon as the coordinator
        # releases it, and may take the GIL into MPI_Init before its server threads have sent
        # the other ranks their release; those then waited out the barrier's deadline (one CI
        # run in six, and 4 of about 40 4-rank `--mpi-in-job` benchmark runs, 2026-12-03). So
        # every other rank says it got through, and rank 0 returns only once all have.
        try:
            self.client.barrier("pycollective/init", timeout=connect_timeout)
            if spec.world_size > 1:
                done = f"pycollective/init-done/{self._link_setup.session}"
                if spec.rank != 0:
                    self.client.set(f"{done}/{spec.rank}", b"1")
                else:
                    for r in range(1, spec.world_size):
                        self.client.get(f"{done}/{r}", timeout=connect_timeout)
        except BaseException:
            self.close(0)
            raise

    def _session(self, rank: int, timeout: float) -> str:
        """A random id shared by the group (names its shared-memory segments)."""
        if rank == 0:
            self.client.set("pycollective/session", secrets.token_hex(8).encode())
        return self.client.get("pycollective/session", timeout=timeout).decode()

    def _set_costs(self) -> None:
        """The cost model's link costs (pycollective/cost_model.py: defaults, measured, or
        configured), and the tuned table of measured winners when every peer uses one
        transport."""
        tuned = tuning.load()
        others = {t for r, t in enumerate(self.transports) if r != self.spec.rank}
        local = "shm" if "shm" in others else (next(iter(others)) if others else "shm")
        self.comm.set_costs(*cost_model.link_costs(local, "grpc" if "grpc" in others else "tcp"))
        if tuned is not None and len(others) == 1:
            self.comm.set_tuned(tuned.table(others.pop(), self.spec.world_size))

    def connect_again(self) -> tuple[list, Any]:
        """Another link to every peer, made as init made the world's (the same transports,
        token and checks), for a native group that needs links of its own (a group of replicas
        across processes). Every rank calls it the same number of times, in the same order.

        Returns the links (None at this rank) and the gRPC data plane that carries them when the
        transport is grpc (the caller closes it with the group), else None."""
        s = self._link_setup
        self.link_sets += 1
        name = f"s{self.link_sets}"
        listener = TcpListener.open(s.ifname, self.spec.master_addr)
        endpoints = {"tcp": listener.endpoint}
        plane = None
        try:
            if s.forced == "grpc":
                from pycollective.grpc_transport import GrpcDataPlane

                host = listener.endpoint.rsplit(":", 1)[0]
                plane = GrpcDataPlane(
                    self.spec.rank,
                    s.token,
                    bind_address(s.ifname, self.spec.master_addr),
                    host,
                    s.connect_timeout,
                )
                endpoints["grpc"] = plane.endpoint
            # Each rank's listener took a port from the OS; the coordinator tells the others.
            key = f"pycollective/links/{name}/"
            self.client.set(key + str(self.spec.rank), json.dumps(endpoints).encode())
            peers = [
                json.loads(self.client.get(key + str(p), timeout=s.connect_timeout))
                for p in range(self.spec.world_size)
            ]
            # The set's name keeps its shm segment names and handshakes apart from the others'.
            links, _ = self._open_links(listener, peers, f"{name}-", plane)
        except BaseException:
            if plane is not None:
                plane.close()
            raise
        finally:
            listener.close()
        return links, plane

    def _open_links(
        self, listener: TcpListener, endpoints: list[dict[str, str]], prefix: str, plane: Any
    ) -> tuple[list, list[str]]:
        s = self._link_setup
        return open_links(
            rank=self.spec.rank,
            size=self.spec.world_size,
            hosts=s.hosts,
            endpoints=endpoints,
            listener=listener,
            token=s.token,
            session=prefix + s.session,
            forced=s.forced,
            timeout=s.connect_timeout,
            shm_ring_bytes=s.shm_ring_bytes,
            grpc_plane=plane,
        )

    def on_abort(self, callback: Callable[[str], None]) -> None:
        """``callback(reason)`` when the world is aborted (a rank failed): groups built on links
        of their own stop waiting too."""
        self._abort_callbacks.append(callback)

    def forget_abort_callback(self, callback: Callable[[str], None]) -> None:
        """Undoes :meth:`on_abort` (a group closed before the world)."""
        if callback in self._abort_callbacks:
            self._abort_callbacks.remove(callback)

    def _on_abort(self, rank: int, reason: str) -> None:
        self.abort_notice = (rank, reason)
        self._notice.set()
        self.comm.abort(f"rank {rank} failed: {reason}" if rank >= 0 else reason)
        for callback in list(self._abort_callbacks):
            callback(f"rank {rank} failed: {reason}" if rank >= 0 else reason)
        for nccl_comm in list(getattr(self, "nccl_comms", {}).values()):
            nccl_comm.abort(f"rank {rank} failed: {reason}" if rank >= 0 else reason)

    def explain_failure(self, exc: CollectiveError) -> CollectiveError:
        """This rank's error, with the cause the coordinator reported when another rank failed
        first. A rank that failed on its own tells the coordinator, so the others learn why."""
        if isinstance(exc, (RemoteError, Aborted)):
            self._notice.wait(0.5)  # the failing rank's notice may still be on its way
            notice = self.abort_notice
            if notice is not None and notice[1] not in str(exc):
                who = f"rank {notice[0]}" if notice[0] >= 0 else "the coordinator"
                return type(exc)(f"{exc}\n  cause, reported by {who}: {notice[1]}")
            return exc
        if not self._reported:
            self._reported = True
            self.client.abort(str(exc))
        return exc

    def keep_until_done(self, native: Any, buffers: list[Any]) -> None:
        """Holds an asynchronous call's buffers until its native Work completes. Calls complete
        in issue order (one executor), so finished ones leave from the front."""
        with self._in_flight_lock:
            in_flight = self._in_flight
            while in_flight and in_flight[0][0].is_completed():
                in_flight.popleft()
            in_flight.append((native, buffers))

    def close(self, timeout: float) -> None:
        failed = self.comm.aborted
        if not failed:
            try:
                self.client.barrier("pycollective/shutdown", timeout=timeout)
            except Exception:  # a failed group still shuts down; peers may be gone
                failed = True
        # A failed group's ranks may be gone (a dead one never arrives at the barrier nor
        # leaves) and every survivor already got the abort: waiting for them would only delay
        # this rank's exit, or its next init(), by `timeout`.
        self.client.close()
        if self.service is not None:
            if not failed:
                # Stop only once everyone left: a stopped service reads as a failure to a rank
                # still connected to it.
                self.service.wait_until_left(timeout)
            self.service.stop(grace=_NOTICE_GRACE_S)
        self.comm.abort("the group was shut down")
        for callback in self._abort_callbacks:
            callback("the group was shut down")
        self._abort_callbacks.clear()
        getattr(self, "nccl_comms", {}).clear()  # destroyed (flushed, bounded) when unreferenced
        if self.grpc_plane is not None:
            self.grpc_plane.close()
        # Release the native communicator (its links, sockets, shared memory and executor
        # thread) now, not when the garbage collector breaks the group <-> world cycle: a
        # next init() in this process must not find the old group's resources still held.
        # (A PreparedCall made on it keeps it alive until that call is dropped.)
        del self.comm
        # The executor has drained (its destructor joins it) unless a PreparedCall still holds
        # the communicator: keep only what may still run.
        with self._in_flight_lock:
            self._in_flight = deque(e for e in self._in_flight if not e[0].is_completed())
        affinity.restore(self._cpus_before)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes that are missing: `comm` once the group was shut down.
        if name == "comm":
            raise RuntimeError(
                f"rank {self.spec.rank} of {self.spec.world_size}: this process group was shut "
                "down (pycollective.shutdown() or reinit()); use the group that the last "
                "pycollective.init() or reinit() returned"
            )
        raise AttributeError(name)


_world: _World | None = None
_lock = threading.Lock()
# This process's rank in the last group it joined (-1: none yet): an elastic re-formation keeps
# survivors in their order.
_previous_rank = -1
# Whether this process, new to an elastic job, joined a group that re-formed (is_replacement()).
_replacement = False


def init(
    rank: int | None = None,
    world_size: int | None = None,
    master: str | None = None,
    token: str | None = None,
    timeout: float | None = None,
    transport: str | None = None,
    ifname: str | None = None,
    connect_timeout: float | None = None,
    announce: Callable[[str], None] | None = None,
    min_size: int | None = None,
) -> ProcessGroup:
    """Joins the default process group and returns it.

    Without arguments the group comes from the environment of the launcher in use:
    ``pycollective run``, ``TF_CONFIG``, torchrun, Open MPI or Slurm (docs/launching.md).
    ``master`` is "host:port" of rank 0's coordination service; ``token`` (or
    ``PYCOLLECTIVE_TOKEN``) must be the same on every rank. ``timeout`` is the default for every
    collective (``PYCOLLECTIVE_TIMEOUT``); ``transport`` forces "shm" or "tcp" for every peer
    (``PYCOLLECTIVE_TRANSPORT``); ``ifname`` picks the interface TCP links use
    (``PYCOLLECTIVE_IFNAME``); ``connect_timeout`` bounds forming the group (60 s).

    ``announce`` (rank 0) lets another channel carry the coordinator's address: rank 0's
    service then listens on ``master``'s port, which may be 0 (the OS picks a free one), and
    ``announce("host:port")`` is called before rank 0 waits for the others, who pass that
    address as ``master`` (pycollective.torch does this through torch.distributed's store).

    Under an elastic launcher (``pycollective run -n MIN:MAX``, which sets
    ``PYCOLLECTIVE_ELASTIC_STORE``), the group is whoever joins the launcher's rendezvous: rank
    and world size are assigned there (survivors of an earlier group keep their order), and
    ``min_size`` is the smallest group this process accepts. So after a failure, ``shutdown()``
    then ``init()`` (or :func:`reinit`) forms a new group with the processes still alive and
    any replacements the launcher started (docs/launching.md, "Elastic jobs").
    """
    global _world, _previous_rank, _replacement
    with _lock:
        if _world is not None:
            raise RuntimeError(
                "pycollective.init() was already called in this process; call "
                "pycollective.shutdown() first"
            )
        config.reload()  # a group's start-up: the variables as they are now, on both sides
        forming_timeout = (
            connect_timeout
            if connect_timeout is not None
            else env_float("PYCOLLECTIVE_CONNECT_TIMEOUT", 60.0)
        )
        store = config.text(elastic.ENV_STORE)
        if min_size is not None and (not store or (rank, world_size, master) != (None, None, None)):
            raise ValueError(
                f"init(min_size={min_size}) needs an elastic rendezvous: launch with "
                "`pycollective run -n MIN:MAX` (which sets PYCOLLECTIVE_ELASTIC_STORE) and give "
                "no rank, world_size or master"
            )
        store_client = None
        if store and (rank, world_size, master) == (None, None, None):
            if announce is not None:
                raise ValueError(
                    "init(announce=...) names rank 0's channel for the coordinator's address, "
                    f"but {elastic.ENV_STORE} is set: the elastic rendezvous is that channel"
                )
            rank, world_size, master, announce, store_client, joined_round = _join_elastic(
                store, token, min_size, forming_timeout
            )
            _replacement = _previous_rank < 0 and joined_round > 1
        try:
            spec = ClusterSpec.from_env(
                rank=rank,
                world_size=world_size,
                master=master,
                token=token,
                announced=announce is not None,
            )
        except BaseException:
            if store_client is not None:
                store_client.close()
            raise
        log.set_rank(spec.rank)
        same_host = None
        if spec.job_key is not None:
            # srun/mpirun with every rank on this host: rank 0 publishes address and token in a
            # private file, the others read it (rendezvous/job_file.py).
            same_host = SameHostJob.join(spec, forming_timeout)
            spec = same_host.spec
            if spec.rank == 0:
                announce = same_host.publish
        try:
            _world = _World(
                spec,
                default_timeout() if timeout is None else float(timeout),
                transport,
                ifname,
                forming_timeout,
                announce,
            )
        finally:
            if same_host is not None:
                same_host.finish()  # every rank has registered (or init failed)
            if store_client is not None:
                store_client.close()
        _previous_rank = spec.rank
        return _world.world


def is_replacement() -> bool:
    """Whether this process joined an elastic job late: it was started to replace a failed
    process, and its group is a re-formed one, whose other members have trained ahead of it
    (they restore a checkpoint, and so must it). False outside elastic jobs."""
    return _replacement


def _join_elastic(
    store: str, token: str | None, min_size: int | None, timeout: float
) -> tuple[int, int, str, Callable[[str], None] | None, Any, int]:
    """Joins the elastic rendezvous: (rank, world_size, master, announce, store client,
    round)."""
    secret = token or config.text("PYCOLLECTIVE_TOKEN")
    if not secret:
        raise ValueError(
            f"{elastic.ENV_STORE} is set but no cluster token is: the elastic launcher sets "
            "PYCOLLECTIVE_TOKEN for every process it starts; set the same one here"
        )
    if min_size is not None and min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    placed, client = elastic.join(
        store, secret, previous_rank=_previous_rank, min_size=min_size or 1, timeout=timeout
    )
    try:
        if placed.rank == 0:
            round_number = placed.round
            return (
                0,
                placed.world_size,
                elastic.coordinator_bind(store),
                lambda address: elastic.publish_coordinator(client, round_number, address),
                client,
                round_number,
            )
        master = elastic.coordinator_of(client, placed.round, timeout)
    except BaseException:
        client.close()
        raise
    return placed.rank, placed.world_size, master, None, client, placed.round


def reinit(
    min_size: int | None = None,
    timeout: float | None = None,
    connect_timeout: float | None = None,
    shutdown_timeout: float = 30.0,
) -> ProcessGroup:
    """Leaves the current group (at once if it failed) and joins a new one with the processes
    still alive: ``shutdown()`` then ``init(min_size=...)``. Needs an elastic launcher
    (``pycollective run -n MIN:MAX``); the new group's ranks are re-numbered from 0 (survivors
    keep their order). ``min_size``: fail (RendezvousError) rather than form a smaller group."""
    shutdown(shutdown_timeout)
    return init(timeout=timeout, connect_timeout=connect_timeout, min_size=min_size)


def shutdown(timeout: float = 30.0) -> None:
    """Leaves the group: waits (up to `timeout`) for every rank to call shutdown, then closes
    links and the coordination service. After a failure it does not wait: the group's links,
    threads and service are released at once, and ``init()`` may form a new group."""
    global _world
    with _lock:
        if _world is None:
            return
        world, _world = _world, None
    world.close(timeout)


def is_initialized() -> bool:
    return _world is not None


def _default() -> ProcessGroup:
    if _world is None:
        raise RuntimeError("no process group: call pycollective.init() first")
    return _world.world


def new_group(ranks: list[int], name: str | None = None) -> ProcessGroup | None:
    """A sub-group of the default group. Every rank must call new_group with the same ranks in
    the same order (members and non-members alike); non-members get None.

    With ``name`` only the members call it: the group's identity (which keeps its sequence
    numbers apart from other groups') comes from the name, which must be the same on every
    member and unique among the groups of the world (e.g. the name a framework gave the group).
    """
    world = _default()._world
    members = sorted(set(int(r) for r in ranks))
    if not members or members[0] < 0 or members[-1] >= world.spec.world_size:
        raise ValueError(f"new_group ranks must be in [0, {world.spec.world_size}), got {ranks}")
    if name is not None:
        if world.comm.rank not in members:
            return None
        return ProcessGroup(world, members, _named_group_id(f"group/{name}"))
    world.groups += 1
    if world.comm.rank not in members:
        return None
    return ProcessGroup(world, members, world.groups)


@functools.lru_cache(maxsize=1024)
def _direction(source: int, dest: int) -> Any:
    """The two ranks of one send/recv direction as a group of their own (global ranks): its
    sequence numbers count only this sender's messages to this receiver."""
    return _C.Members(
        ranks=sorted((source, dest)), group_id=_named_group_id(f"p2p/{source}->{dest}")
    )


def _named_group_id(name: str) -> int:
    """A group id from a name, the same on every rank: 30 bits of its CRC with bit 30 set, so it
    never equals the small counters new_group() without a name hands out."""
    return (zlib.crc32(name.encode()) & 0x3FFFFFFF) | 0x40000000


def _group(group: ProcessGroup | None) -> ProcessGroup:
    return _default() if group is None else group


def rank() -> int:
    """This process's rank in the default group."""
    return _default().rank


def world_size() -> int:
    return _default().size


def local_rank() -> int:
    """This process's index among the ranks on its host."""
    w = _default()._world
    return w.local_ranks.index(w.comm.rank)


def local_size() -> int:
    """How many ranks run on this host."""
    return len(_default()._world.local_ranks)


def allreduce(
    x: Any,
    op: str | ReduceOp = "sum",
    algo: str = "auto",
    inplace: bool = False,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
    compress: str | None = None,
) -> Any:
    """Every rank gets the reduction (sum, prod, min, max, avg) of all ranks' tensors."""
    world = _world
    if group is None and world is not None:
        # The plain call on the default group, remembered, runs from here: with 4 ranks on 2
        # cores each Python frame before the native call costs about half a microsecond
        # (ProcessGroup.allreduce has the same path for any group).
        if op == "sum" and algo == "auto" and not inplace and timeout is None and compress is None:
            memo = world.world._memo
            layouts = memo.plain_out if out is not None else memo.plain_new
            if layouts is not None:
                try:
                    result = layouts.run(world.comm, x, out)
                except CollectiveError as exc:
                    raise world.explain_failure(exc) from None
                if result is not NotImplemented:
                    return result
        group = world.world
    # _group written out: one Python call fewer on the path of every small call.
    return (_default() if group is None else group).allreduce(
        x, op, algo, inplace, out, timeout, compress
    )


def prepare_allreduce(
    x: Any,
    op: str | ReduceOp = "sum",
    algo: str = "auto",
    inplace: bool = False,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
    compress: str | None = None,
) -> PreparedCall:
    """``allreduce`` prepared once to run many times on the same buffers
    (:meth:`ProcessGroup.prepare_allreduce`): ``plan = prepare_allreduce(x, out=y)``, then
    ``plan()`` in the loop."""
    return _group(group).prepare_allreduce(x, op, algo, inplace, out, timeout, compress)


def allreduce_async(
    x: Any,
    op: str | ReduceOp = "sum",
    algo: str = "auto",
    inplace: bool = False,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
    compress: str | None = None,
) -> Work:
    """Starts an allreduce; ``.wait()`` on the returned Work gives the result."""
    return _group(group).allreduce_async(x, op, algo, inplace, out, timeout, compress)


def reduce_scatter(
    x: Any,
    op: str | ReduceOp = "sum",
    algo: str = "auto",
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
    compress: str | None = None,
) -> Any:
    return _group(group).reduce_scatter(x, op, algo, out, timeout, compress)


def allgather(
    x: Any,
    algo: str = "auto",
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
) -> Any:
    return _group(group).allgather(x, algo, out, timeout)


def broadcast(
    x: Any,
    root: int = 0,
    algo: str = "auto",
    inplace: bool = False,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
) -> Any:
    return _group(group).broadcast(x, root, algo, inplace, out, timeout)


def reduce(
    x: Any,
    root: int = 0,
    op: str | ReduceOp = "sum",
    algo: str = "auto",
    inplace: bool = False,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
) -> Any:
    return _group(group).reduce(x, root, op, algo, inplace, out, timeout)


def alltoall(
    x: Any,
    out: Any = None,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
) -> Any:
    """See :meth:`ProcessGroup.alltoall`."""
    return _group(group).alltoall(x, out, send_counts, recv_counts, timeout)


def gather(
    x: Any,
    root: int = 0,
    out: Any = None,
    group: ProcessGroup | None = None,
    timeout: float | None = None,
) -> Any:
    """See :meth:`ProcessGroup.gather`."""
    return _group(group).gather(x, root, out, timeout)


def scatter(
    x: Any, out: Any, root: int = 0, group: ProcessGroup | None = None, timeout: float | None = None
) -> Any:
    """See :meth:`ProcessGroup.scatter`."""
    return _group(group).scatter(x, out, root, timeout)


def send(
    x: Any, dst: int, tag: int = 0, group: ProcessGroup | None = None, timeout: float | None = None
) -> None:
    """See :meth:`ProcessGroup.send`."""
    _group(group).send(x, dst, tag, timeout)


def recv(
    x: Any, src: int, tag: int = 0, group: ProcessGroup | None = None, timeout: float | None = None
) -> Any:
    """See :meth:`ProcessGroup.recv`."""
    return _group(group).recv(x, src, tag, timeout)


def barrier(group: ProcessGroup | None = None, timeout: float | None = None) -> None:
    """See :meth:`ProcessGroup.barrier`."""
    world = _world
    if group is None and timeout is None and world is not None:
        # The default group's barrier runs from here, as the plain allreduce does: with ranks
        # sharing cores, every Python frame on one rank's path delays the rank beside it
        # (2 ranks, a loop of barriers: 1.38 us a call through ProcessGroup.barrier, about
        # half without its frames).
        try:
            world.comm.run(world.world._default_barrier, world.world._native_members, None, None)
        except CollectiveError as exc:
            raise world.explain_failure(exc) from None
        return
    _group(group).barrier(timeout)


def _leave_quietly() -> None:
    """A process that exits without shutdown() still leaves the coordinator cleanly.

    Runs when the interpreter starts shutting down threads: the coordination service's handler
    threads (streams of the other ranks) must be stopped before Python joins them, or exit
    would wait for them forever."""
    global _world
    if _world is not None:
        world, _world = _world, None
        try:
            world.client.close()
            if world.service is not None:
                if not world.comm.aborted:  # a failed group's ranks may never leave
                    world.service.wait_until_left(5.0)
                world.service.stop(grace=_NOTICE_GRACE_S)
            world.comm.abort("the process is exiting")
            if world.grpc_plane is not None:
                world.grpc_plane.close()
        except Exception:
            pass


# threading._register_atexit runs before non-daemon threads are joined (concurrent.futures uses
# it for the same reason); plain atexit would run only after, too late. Hooks run in reverse
# order of registration, so concurrent.futures.thread (whose hook refuses new work to the gRPC
# servers' thread pools) is imported first: ours must run before it.
import concurrent.futures.thread  # noqa: E402,F401

_register = getattr(threading, "_register_atexit", atexit.register)
_register(_leave_quietly)
