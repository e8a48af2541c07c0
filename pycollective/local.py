"""LocalCommunicator: several replicas inside one process (what MirroredStrategy needs).

Each replica runs on its own native thread over in-process links, executing exactly the
algorithm code a multi-process group runs; the GIL is released for the whole collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pycollective import config, tuning
from pycollective._calls import KINDS, Prepared, call_spec, check_avg, prepare
from pycollective._ext import _C
from pycollective.config import default_timeout, env_int
from pycollective.device import is_device_tensor
from pycollective.reduce_op import ReduceOp, parse_op
from pycollective.tensors import adapt, shape_hash


class LocalCommunicator:
    """``n`` replicas in this process.

    Args:
        num_replicas: how many replicas (threads).
        timeout: seconds a collective may take (default ``PYCOLLECTIVE_TIMEOUT`` or 300).
        group_size: replicas per group for ``algo="hierarchical"`` (default
            ``PYCOLLECTIVE_HIERARCHICAL_GROUP_SIZE``, else one group of all replicas). Must
            divide ``num_replicas``.

    Every method takes one tensor per replica (a list of length ``num_replicas``) and returns
    one result per replica. Every replica's result is bitwise identical to the others'. Threads
    may share a communicator: their calls run one at a time, each whole.

    ``algo="auto"`` (the default) starts from the cost model (or a tuned table, from
    ``pycollective tune``). Where the model prices two or more algorithms within 1.25x of each
    other (``"inline"``, priced by a model of its own, within 1.5x of the others), a near tie
    it cannot call, or where a tuned table's entry is not the model's only
    near choice, it measures: the first calls of that shape (collective, size, dtype, op) time
    each of them in turn (the table's entry first, and a near tie stays with it); later calls
    run the fastest, and now and then another, which takes over only if it ran 1.1x faster
    than the choice's calls both before and after it, so that the choice follows the machine
    (``explain`` shows the times). Where the choice's recent calls all come to run 2x slower
    than usual (not only the few after other work), or its first timed calls 2x slower than
    the model prices them (on a VM whose vCPUs drift apart, the algorithms that pass data
    between replica threads slow 4-6x while ``direct`` and ``inline`` do not), the other
    algorithms are timed too. At most ``auto_trial_calls`` calls per shape go to the first
    trial.
    ``PYCOLLECTIVE_AUTO_TRIALS=0`` keeps the model's (or the table's) choice alone, the same on
    every run (with 3 or more replicas the algorithms sum floats in different orders, so a
    measured choice can change the last bits between runs).
    """

    def __init__(
        self, num_replicas: int, timeout: float | None = None, group_size: int | None = None
    ) -> None:
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
        config.reload()  # a group's start-up: the variables as they are now, on both sides
        if group_size is None:
            group_size = env_int("PYCOLLECTIVE_HIERARCHICAL_GROUP_SIZE", 0)
        self._timeout = default_timeout() if timeout is None else float(timeout)
        self._group = _C.LocalGroup(size=num_replicas, timeout=self._timeout, group_size=group_size)
        tuned = tuning.load()
        if tuned is not None:
            costs = tuned.inproc_costs(num_replicas)
            if costs is not None:
                self._group.set_costs(costs)
            self._group.set_tuned(tuned.table("inproc", num_replicas))
        self.num_replicas = num_replicas
        self.group_size = group_size or num_replicas
        #: the most calls of one shape that ``algo="auto"`` spends timing candidates
        self.auto_trial_calls: int = self._group.auto_trial_calls

    def __repr__(self) -> str:
        return f"LocalCommunicator({self.num_replicas})"

    # The collectives ------------------------------------------------------------------------

    def allreduce(
        self,
        tensors: Sequence[Any],
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Every replica gets the reduction of all replicas' tensors.

        ``op``: sum, prod, min, max, avg. ``algo``: one of :func:`pycollective.algorithms`.
        ``inplace=True`` writes the result into the inputs (and returns them); ``out=`` (one
        tensor per replica, every method has it) writes into tensors you allocated once, which
        spares the page faults of fresh result memory in a training loop.
        """
        return self._run("allreduce", tensors, op, algo, 0, inplace, timeout, out)

    def reduce_scatter(
        self,
        tensors: Sequence[Any],
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Replica ``r`` gets chunk ``r`` of the reduction: rows of axis 0 when the first
        dimension divides evenly by the replica count, else a flat chunk of the flattened
        result (the first ``size % n`` replicas hold one extra element)."""
        return self._run("reduce_scatter", tensors, op, algo, 0, False, timeout, out)

    def allgather(
        self,
        tensors: Sequence[Any],
        algo: str = "auto",
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Every replica gets all replicas' tensors stacked: shape ``(n, *shape)``."""
        return self._run("allgather", tensors, "sum", algo, 0, False, timeout, out)

    def broadcast(
        self,
        tensors: Sequence[Any],
        root: int = 0,
        algo: str = "auto",
        inplace: bool = False,
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Every replica gets replica ``root``'s tensor."""
        return self._run("broadcast", tensors, "sum", algo, root, inplace, timeout, out)

    def reduce(
        self,
        tensors: Sequence[Any],
        root: int = 0,
        op: str | ReduceOp = "sum",
        algo: str = "auto",
        inplace: bool = False,
        out: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Replica ``root`` gets the reduction; the other entries of the result are None
        (with out=, only the root's out tensor is written, and the others' entries may be
        None)."""
        return self._run("reduce", tensors, op, algo, root, inplace, timeout, out)

    def explain(self, collective: str, nbytes: int, dtype: str = "float32") -> str:
        """The algorithm ``algo="auto"`` runs for a call of this size, and why: its trial's
        times once calls of this shape have run, else the model's pick and costs (``inline``'s
        first, then each algorithm's), or the tuned table's entry."""
        from pycollective.tensors import DTYPE_NAMES

        code = {v: k for k, v in DTYPE_NAMES.items()}[dtype]
        itemsize = {0: 2, 1: 2, 2: 4, 3: 8, 4: 1, 5: 1, 6: 4, 7: 8}[code]
        return self._group.explain(
            _C.CallSpec(kind=KINDS[collective], count=nbytes // itemsize, dtype=code)
        )

    # Plumbing -------------------------------------------------------------------------------

    def _run(
        self,
        kind: str,
        tensors: Sequence[Any],
        op: str | ReduceOp,
        algo: str,
        root: int,
        inplace: bool,
        timeout: float | None,
        out: Sequence[Any] | None,
    ) -> list[Any]:
        n = self.num_replicas
        check_replica_lists(kind, n, tensors, out)
        if not isinstance(root, int) or not 0 <= root < n:
            raise ValueError(f"root must be a replica index in [0, {n}), got {root!r}")
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a string, got {type(algo).__name__}")
        reduce_op = parse_op(op)
        if algo == "nccl" or (not _is_numpy(tensors[0]) and is_device_tensor(tensors[0])):
            return self._run_device(kind, tensors, reduce_op, algo, root, inplace, timeout, out)
        return run_host(
            self._group,
            kind,
            tensors,
            reduce_op,
            algo,
            root,
            inplace,
            self._timeout if timeout is None else float(timeout),
            out,
        )

    def _run_device(
        self,
        kind: str,
        tensors: Sequence[Any],
        reduce_op: ReduceOp,
        algo: str,
        root: int,
        inplace: bool,
        timeout: float | None,
        out: Sequence[Any] | None,
    ) -> list[Any]:
        """Device tensors (CuPy, torch CUDA): the same algorithms over device buffers (every
        local step a kernel or a device copy, finished before the call returns), or
        algo="nccl": one NCCL communicator per replica, replicas on distinct devices, enqueued
        on each tensor's current stream (results ready in stream order)."""
        from pycollective import nccl
        from pycollective.device import adapt_device, prepare_device

        n = self.num_replicas
        for i, t in enumerate(tensors):
            if not is_device_tensor(t):
                need = (
                    'algo="nccl" needs'
                    if algo == "nccl"
                    else "replica 0 passed a device tensor, so every replica needs"
                )
                raise TypeError(
                    f"replica {i}: {need} a device tensor (a CuPy array or a "
                    f"PyTorch CUDA tensor), got {type(t).__name__}"
                )
        bufs = [adapt_device(t, f"replica {i}") for i, t in enumerate(tensors)]
        _check_alike([(b.code, b.dtype_name, b.shape) for b in bufs])
        first = bufs[0]
        check_avg(kind, reduce_op, first.code, "replica 0")
        outs = [
            None if o is None else adapt_device(o, f"replica {i} out=")
            for i, o in enumerate(out or [None] * n)
        ]
        calls = [
            prepare_device(kind, b, i, n, root, inplace, f"replica {i}", outs[i])
            for i, b in enumerate(bufs)
        ]
        if algo == "nccl":
            nccl.check_call(kind, first, reduce_op, n, "replica 0")
            comms = self._nccl_communicators([b.device for b in bufs])
            with nccl.group():
                for comm, c in zip(comms, calls):
                    nccl.enqueue(comm, kind, c.inp, c.out, reduce_op, root, c.inp.stream)
        else:
            spec = call_spec(
                KINDS[kind],
                first.count,
                first.code,
                int(reduce_op),
                root,
                algo,
                shape_hash(first.shape),
                self._timeout if timeout is None else float(timeout),
            )
            self._group.run_device(
                spec,
                ins=[c.inp.ptr for c in calls],
                outs=[c.out.ptr if c.out is not None else 0 for c in calls],
                devices=[c.inp.device for c in calls],
                streams=[c.inp.stream for c in calls],
            )
        return [c.result() for c in calls]

    def _nccl_communicators(self, devices: list[int]) -> list[Any]:
        """One NCCL communicator per replica (made on first use, for these devices)."""
        from pycollective import nccl

        cached = getattr(self, "_nccl", None)
        if cached is None or cached[0] != devices or any(c.aborted for c in cached[1]):
            self._nccl = (devices, nccl.NcclCommunicator.init_all(devices, self._timeout))
        return self._nccl[1]


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy"


def _check_alike(replicas: list[tuple[int, str, tuple]]) -> None:
    """Every replica's (dtype code, dtype name, shape) must equal replica 0's."""
    code0, name0, shape0 = replicas[0]
    for i, (code, name, shape) in enumerate(replicas[1:], start=1):
        if code != code0:
            raise TypeError(
                f"replica {i} passed {name} but replica 0 passed {name0}; every "
                "replica must pass the same dtype"
            )
        if shape != shape0:
            raise ValueError(
                f"replica {i} passed shape {shape} but replica 0 passed {shape0}; "
                "every replica must pass the same shape"
            )


def check_replica_lists(
    kind: str, n: int, tensors: Sequence[Any], out: Sequence[Any] | None
) -> None:
    """``tensors`` (and ``out``, when given) are lists of one tensor per replica."""
    for name, seq in (("tensors", tensors), ("out", out)):
        if seq is None and name == "out":
            continue
        if not isinstance(seq, (list, tuple)):
            raise TypeError(
                f"{kind} expects {name} as a list of {n} tensors (one per "
                f"replica), got {type(seq).__name__}"
            )
        if len(seq) != n:
            raise ValueError(f"{kind} expects {n} {name} (one per replica), got {len(seq)}")


def run_host(
    group: Any,
    kind: str,
    tensors: Sequence[Any],
    reduce_op: ReduceOp,
    algo: str,
    root: int,
    inplace: bool,
    timeout: float,
    out: Sequence[Any] | None,
    wire: int = 0,
) -> list[Any]:
    """One collective of host tensors (one per replica, counts already checked) on a native
    ``_C.LocalGroup``: adapts and checks every replica's tensor, runs, returns the results.
    ``wire``: the compressed wire format's code (``_calls.wire_code``), for groups across
    processes."""
    n = len(tensors)
    bufs = [adapt(t, f"replica {i}") for i, t in enumerate(tensors)]
    _check_alike([(b.code, b.dtype_name, b.array.shape) for b in bufs])
    first = bufs[0]
    check_avg(kind, reduce_op, first.code, "replica 0")
    # An out entry of None: a new result there (reduce's replicas other than the root get none).
    outs = [
        None if o is None else adapt(o, f"replica {i} out=")
        for i, o in enumerate(out or [None] * n)
    ]
    calls: list[Prepared] = [
        prepare(kind, b, i, n, root, inplace, f"replica {i}", outs[i]) for i, b in enumerate(bufs)
    ]
    spec = call_spec(
        KINDS[kind],
        first.count,
        first.code,
        int(reduce_op),
        root,
        algo,
        shape_hash(first.array.shape),
        timeout,
        wire,
    )
    group.run(spec, ins=[c.inp for c in calls], outs=[c.out for c in calls])
    return [c.result() for c in calls]
