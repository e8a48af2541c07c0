"""The "pycollective" torch.distributed backend: a ``torch.distributed.ProcessGroup`` whose
methods call a pycollective process group's collectives.

Each method receives what torch's functional API (``dist.all_reduce`` ...) or a C++ caller
(DDP's reducer, FSDP) passes, starts the matching pycollective collective and returns a
:class:`~pycollective.torch.work.Work`. Calls that torch makes synchronously
(``opts.asyncOp`` false: ``dist.all_reduce(t)`` without ``async_op=True``) run on the calling
thread, which saves a thread hand-off per call; the others run on the communicator's worker
thread in issue order. Contiguous tensors are handed to the native core as they are (their
memory is the collective's buffer); others go through a contiguous copy and back.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import pycollective as pc
from pycollective.errors import CollectiveError
from pycollective.torch import rendezvous
from pycollective.torch.ops import Staging, host_array, reduce_op, scaled
from pycollective.torch.work import Work, backend_error, seconds, stop_completer


def create_backend(opts: Any, backend_options: Any = None) -> ProcessGroup:
    """The creator torch calls (extended API) for each "pycollective" group."""
    timeout = seconds(opts.timeout) or 1800.0
    group, owned = rendezvous.join(
        opts.store,
        opts.group_rank,
        opts.group_size,
        timeout,
        list(opts.global_ranks_in_group),
        str(opts.group_id),
    )
    return ProcessGroup(group, opts.group_rank, opts.group_size, timeout, owned)


class ProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup over a :class:`pycollective.ProcessGroup`. Made by torch
    (``init_process_group("pycollective")``, ``new_group(backend="pycollective")``)."""

    def __init__(self, group: pc.ProcessGroup, rank: int, size: int, timeout: float, owned: bool):
        super().__init__(rank, size)
        self._group = group
        self._timeout = timeout
        self._owned = owned
        self._where = f"[rank {rank}/{size}] pycollective"

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "pycollective"

    # torch keeps a group's name on its C++ backends, and a ProcessGroup written in Python
    # has none: without these, `group.group_name` raises "ProcessGroup name not set" (which
    # DeviceMesh, hence FSDP2, reads). torch sets the name from Python right after creation.
    def _set_group_name(self, name: str) -> None:
        self._name = name
        super()._set_group_name(name)

    @property
    def group_name(self) -> str:
        name = getattr(self, "_name", None)
        if name is None:
            raise RuntimeError(
                f"{self._where}: this group has no name yet (torch names it "
                "when new_group/init_process_group returns)"
            )
        return name

    @property
    def pycollective_group(self) -> pc.ProcessGroup:
        """The pycollective group underneath (for pycollective's own API on the same ranks)."""
        return self._group

    # -- the machinery every collective shares ---------------------------------------------

    def _call_timeout(self, opts: Any) -> float:
        return seconds(getattr(opts, "timeout", None)) or self._timeout

    def _start(
        self, opts: Any, outputs: list, staging: Staging, steps: list[Callable[[bool, float], Any]]
    ) -> Work:
        """Runs ``steps`` (each starts one pycollective call: ``step(asynchronous, timeout)``
        returns its Work when asynchronous) and wraps them in one torch Work."""
        asynchronous = getattr(opts, "asyncOp", True)
        timeout = self._call_timeout(opts)
        try:
            if asynchronous:
                handles = [step(True, timeout) for step in steps]
                return Work(handles, outputs, staging.finish())
            for step in steps:
                step(False, timeout)
        except CollectiveError as exc:
            raise backend_error(exc) from None
        return Work([], outputs, staging.finish())

    def _host_only(self, what: str, *tensors: Any) -> None:
        """The pairwise collectives move host memory; NCCL (device tensors) has none of them."""
        for t in tensors:
            if t is not None and t.device.type != "cpu":
                raise TypeError(
                    f"{self._where}: {what} runs on CPU tensors only, got one on {t.device}; "
                    "device tensors are supported by all_reduce, broadcast, reduce, all_gather, "
                    "all_gather_into_tensor, reduce_scatter and reduce_scatter_tensor (copy the "
                    "tensor to the CPU for this call)"
                )

    def _one(self, tensors: list, what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(
                f"{self._where}: {what} takes one tensor per process, got {len(tensors)}"
            )
        return tensors[0]

    # -- reductions --------------------------------------------------------------------------

    def allreduce(self, tensors: list, opts: Any = None) -> Work:
        opts = opts or dist.AllreduceOptions()
        op, factor = reduce_op(opts.reduceOp, self._where)
        staging, steps = Staging(), []
        for t in tensors:
            buf = staging.output(t)
            if factor is not None:  # the sum runs on a scaled copy, copied back into t
                buf = scaled(buf, factor)
                staging.copy_back(t, buf)
            steps.append(self._allreduce_step(buf, op))
        return self._start(opts, list(tensors), staging, steps)

    def _allreduce_step(self, buf: torch.Tensor, op: str) -> Callable[[bool, float], Any]:
        g, buf = self._group, host_array(buf)

        def step(asynchronous: bool, timeout: float) -> Any:
            if asynchronous:
                return g.allreduce_async(buf, op, inplace=True, timeout=timeout)
            return g.allreduce(buf, op, inplace=True, timeout=timeout)

        return step

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> Work:
        """One allreduce over the tensors flattened together (one message stream instead of
        one per tensor), copied back into each."""
        opts = opts or dist.AllreduceCoalescedOptions()
        op, factor = reduce_op(opts.reduceOp, self._where)
        if not tensors:
            return Work([], [])
        if len({t.dtype for t in tensors}) != 1:
            raise TypeError(
                f"{self._where}: allreduce_coalesced needs tensors of one dtype, "
                f"got {sorted(str(t.dtype) for t in tensors)}"
            )
        flat = scaled(torch.cat([t.reshape(-1) for t in tensors]), factor)
        staging = Staging()
        offset = 0
        for t in tensors:
            staging.copy_back(t, flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()
        return self._start(opts, list(tensors), staging, [self._allreduce_step(flat, op)])

    def reduce(self, tensors: list, opts: Any = None) -> Work:
        opts = opts or dist.ReduceOptions()
        op, factor = reduce_op(opts.reduceOp, self._where)
        t = self._one(tensors, "reduce")
        staging = Staging()
        buf = staging.output(t)
        if factor is not None:
            buf = scaled(buf, factor)
            if self._group.rank == opts.rootRank:  # the other ranks' tensors stay as they were
                staging.copy_back(t, buf)
        g, root, buf = self._group, opts.rootRank, host_array(buf)

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.reduce_async if asynchronous else g.reduce
            return run(buf, root, op, inplace=True, timeout=timeout)

        return self._start(opts, [t], staging, [step])

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any = None) -> Work:
        """Rank r's output gets the reduction of every rank's input_lists[0][r]. The inputs
        are laid end to end in one buffer (a copy: they are separate tensors) and reduced in
        one native reduce-scatter."""
        out = self._one(outputs, "reduce_scatter")
        inputs = self._one(input_lists, "reduce_scatter")
        if len(inputs) != self.size():
            raise ValueError(
                f"{self._where}: reduce_scatter takes {self.size()} inputs, got {len(inputs)}"
            )
        for i, t in enumerate(inputs):
            if t.numel() != out.numel() or t.dtype != out.dtype:
                raise ValueError(
                    f"{self._where}: reduce_scatter input {i} is {t.dtype} "
                    f"{tuple(t.shape)}; every input must match the output "
                    f"({out.dtype} {tuple(out.shape)})"
                )
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self._reduce_scatter(flat, out, opts or dist.ReduceScatterOptions())

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        """reduce_scatter_tensor: rank r gets the reduction of block r of every rank's input."""
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                f"{self._where}: reduce_scatter_tensor needs an input of "
                f"{self.size()} x the output's {output.numel()} elements and the "
                f"same dtype; got {input.dtype} {tuple(input.shape)} -> "
                f"{output.dtype} {tuple(output.shape)}"
            )
        return self._reduce_scatter(
            Staging().input(input).reshape(-1), output, opts or dist.ReduceScatterOptions()
        )

    _reduce_scatter_base = reduce_scatter_single  # the name torch < 2.13 calls

    def _reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor, opts: Any) -> Work:
        op, factor = reduce_op(opts.reduceOp, self._where)
        flat = scaled(flat, factor)
        staging = Staging()
        flat, buf = host_array(flat), host_array(staging.output(out).reshape(-1))
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.reduce_scatter_async if asynchronous else g.reduce_scatter
            return run(flat, op, out=buf, timeout=timeout)

        return self._start(opts, [out], staging, [step])

    def reduce_scatter_tensor_coalesced(
        self, outputs: list, inputs: list, opts: Any = None
    ) -> Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, list(outputs))

    # -- data movement -----------------------------------------------------------------------

    def broadcast(self, tensors: list, opts: Any = None) -> Work:
        opts = opts or dist.BroadcastOptions()
        t = self._one(tensors, "broadcast")
        staging = Staging()
        buf = host_array(staging.output(t))
        g, root = self._group, opts.rootRank

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.broadcast_async if asynchronous else g.broadcast
            return run(buf, root, inplace=True, timeout=timeout)

        return self._start(opts, [t], staging, [step])

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> Work:
        """Every rank's input into output_lists[0][r]: a pairwise exchange that sends the input
        to each peer and receives straight into each output tensor (no staging buffer)."""
        opts = opts or dist.AllgatherOptions()
        outs = self._one(output_lists, "allgather")
        x = self._one(inputs, "allgather")
        if len(outs) != self.size():
            raise ValueError(
                f"{self._where}: allgather takes {self.size()} outputs, got {len(outs)}"
            )
        staging = Staging()
        src = staging.input(x)
        g = self._group
        if x.device.type != "cpu":
            # Device tensors go through NCCL, which has no pairwise exchange: gather into one
            # buffer and copy the blocks out (DDP's parameter check on CUDA comes this way).
            gathered = torch.empty((len(outs),) + tuple(x.shape), dtype=x.dtype, device=x.device)
            for p, o in enumerate(outs):
                staging.copy_back(o, gathered[p])

            def step(asynchronous: bool, timeout: float) -> Any:
                run = g.allgather_async if asynchronous else g.allgather
                return run(src, out=gathered, timeout=timeout)

            return self._start(opts, [list(outs)], staging, [step])
        src, bufs = host_array(src), [host_array(staging.output(o)) for o in outs]

        def step(asynchronous: bool, timeout: float) -> Any:
            if asynchronous:
                return g.alltoall_async([src] * len(bufs), bufs, timeout=timeout)
            return g.alltoall([src] * len(bufs), bufs, timeout=timeout)

        return self._start(opts, [list(outs)], staging, [step])

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        """all_gather_into_tensor: the ranks' inputs end to end in `output` (native allgather
        straight into it)."""
        opts = opts or dist.AllgatherOptions()
        if output.numel() != input.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                f"{self._where}: all_gather_into_tensor needs an output of "
                f"{self.size()} x the input's {input.numel()} elements and the "
                f"same dtype; got {input.dtype} {tuple(input.shape)} -> "
                f"{output.dtype} {tuple(output.shape)}"
            )
        staging = Staging()
        src = staging.input(input)
        buf = host_array(staging.output(output).view((self.size(),) + tuple(src.shape)))
        src, g = host_array(src), self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.allgather_async if asynchronous else g.allgather
            return run(src, out=buf, timeout=timeout)

        return self._start(opts, [output], staging, [step])

    _allgather_base = all_gather_single  # the name torch < 2.13 calls

    def allgather_into_tensor_coalesced(
        self, outputs: list, inputs: list, opts: Any = None
    ) -> Work:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(works, list(outputs))

    def gather(self, output_lists: list, inputs: list, opts: Any = None) -> Work:
        opts = opts or dist.GatherOptions()
        x = self._one(inputs, "gather")
        self._host_only("gather", x)
        root = opts.rootRank
        staging = Staging()
        outs = None
        if self.rank() == root:
            outs = [staging.output(o) for o in self._one(output_lists, "gather")]
        src = staging.input(x)
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            return g.gather(src, root, out=outs, timeout=timeout, asynchronous=asynchronous)

        return self._start(opts, list(output_lists), staging, [step])

    def scatter(self, outputs: list, input_lists: list, opts: Any = None) -> Work:
        opts = opts or dist.ScatterOptions()
        out = self._one(outputs, "scatter")
        self._host_only("scatter", out)
        root = opts.rootRank
        staging = Staging()
        chunks = None
        if self.rank() == root:
            chunks = [staging.input(c) for c in self._one(input_lists, "scatter")]
        buf = staging.output(out)
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            return g.scatter(chunks, buf, root, timeout=timeout, asynchronous=asynchronous)

        return self._start(opts, [out], staging, [step])

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> Work:
        """inputs[p] goes to rank p; outputs[p] receives rank p's (pairwise exchange, each
        tensor sent and received in place)."""
        opts = opts or dist.AllToAllOptions()
        self._host_only("all_to_all", *outputs, *inputs)
        staging = Staging()
        outs = [staging.output(o) for o in outputs]
        ins = [staging.input(i) for i in inputs]
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.alltoall_async if asynchronous else g.alltoall
            return run(ins, outs, timeout=timeout)

        return self._start(opts, list(outputs), staging, [step])

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list,
        input_split_sizes: list,
        opts: Any = None,
    ) -> Work:
        """all_to_all_single: blocks of dim 0, even or by the split sizes (pairwise exchange
        straight between the two tensors)."""
        opts = opts or dist.AllToAllOptions()
        self._host_only("all_to_all_single", input, output)
        staging = Staging()
        src = staging.input(input)
        buf = staging.output(output)
        sends = list(input_split_sizes) or None
        recvs = list(output_split_sizes) or None
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            run = g.alltoall_async if asynchronous else g.alltoall
            return run(src, out=buf, send_counts=sends, recv_counts=recvs, timeout=timeout)

        return self._start(opts, [output], staging, [step])

    all_to_all_single = alltoall_base

    def send(self, tensors: list, dst: int, tag: int = 0) -> Work:
        t = self._one(tensors, "send")
        self._host_only("send", t)
        src = Staging().input(t)
        g = self._group
        return self._start(
            None,
            [t],
            Staging(),
            [lambda asynchronous, timeout: g.send(src, dst, tag, timeout, asynchronous)],
        )

    def recv(self, tensors: list, src: int, tag: int = 0) -> Work:
        t = self._one(tensors, "recv")
        self._host_only("recv", t)
        staging = Staging()
        buf = staging.output(t)
        g = self._group
        return self._start(
            None,
            [t],
            staging,
            [lambda asynchronous, timeout: g.recv(buf, src, tag, timeout, asynchronous)],
        )

    def recv_anysource(self, tensors: list, tag: int = 0) -> Work:
        raise RuntimeError(
            f"{self._where}: recv without a source rank is not supported: "
            "pycollective matches point-to-point messages per pair of ranks; "
            "pass src="
        )

    def barrier(self, opts: Any = None) -> Work:
        g = self._group

        def step(asynchronous: bool, timeout: float) -> Any:
            return g.barrier_async(timeout) if asynchronous else g.barrier(timeout)

        return self._start(opts or dist.BarrierOptions(), [], Staging(), [step])

    # -- lifetime ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """destroy_process_group(): the group that formed pycollective's links closes them
        (and rank 0 its coordination service) once every rank left; sub-groups own nothing."""
        self._leave(min(self._timeout, 30.0))

    def abort(self) -> None:
        """Closes the links at once, without waiting for the other ranks to leave (they see
        this rank gone, as after a crash)."""
        self._leave(0.0)

    def _leave(self, timeout: float) -> None:
        if self._owned:
            self._owned = False
            stop_completer()
            rendezvous.leave(timeout)


def _joined(works: list[Work], outputs: list) -> Work:
    """One Work over several (the *_coalesced calls). Every part is waited on, finished ones
    too: a part whose native calls are done may not have raised its error or copied its
    results back into non-contiguous outputs yet (its own wait() does both)."""
    return Work([_Waitable(w) for w in works], outputs)


class _Waitable:
    """A torch Work seen as a pycollective handle (wait(timeout) / is_completed())."""

    def __init__(self, work: Work):
        self._work = work

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout: float | None = None) -> None:
        self._work.wait(None if timeout is None else datetime.timedelta(seconds=timeout))
