"""One rank of a multi-process benchmark run (started by bench/procs.py, or by mpirun for the
MPI peer). Reads its job from a JSON file; at each size it checks every algorithm's result, then
times the algorithms against each other in interleaved rounds (bench/timing.py) with a barrier
before each iteration. Rank 0 writes the rows: time = the slowest rank's, median over iterations.

Backends: "pycollective" (our transports and algorithms), "gloo" (torch.distributed),
"mpi" (mpi4py over the system MPI)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from .metrics import human_bytes
from .patterns import count_wrong, expected, np_dtype, out_buffer, poison, rank_input
from .timing import second_look, summarize, time_interleaved

#: The row of pycollective.prepare_allreduce: auto's choice, every check made once.
PREPARED = "prepared"
#: The same on pycollective.shared_empty arrays, which the ranks map from each other.
SHARED = "shared"
#: auto's call returning new result arrays (y = allreduce(x)), timed in the same rounds as the
#: out= rows (--new-outputs-row): what a new output costs, as a ratio from one run.
AUTO_NEW_OUTPUTS = "auto+new"
#: Rows that are calls of auto, not algorithms: each runs a trial, and none is ever "the best
#: algorithm" set beside auto.
AUTO_ROWS = ("auto", AUTO_NEW_OUTPUTS)
#: How auto keeps its choice, from its explain (a row's "measures"): it races near rivals, so its
#: samples include their calls; or it runs one algorithm and times its calls, racing the others
#: only should it slow down; or neither ("").
RACING, WATCHED = "racing", "watched"


def how_auto_measures(explained: str) -> str:
    """RACING, WATCHED or "" for a group's explain of auto's choice."""
    if "(measured," in explained:
        return RACING
    return WATCHED if "its calls are timed" in explained else ""


class PycollectiveBackend:
    def __init__(self, job: dict) -> None:
        import pycollective as pc

        self.pc = pc
        # "auto": each peer's own (shm on its host, tcp across: with --hosts, hierarchical's).
        transport = job["transport"]
        self.group = pc.init(transport=None if transport == "auto" else transport)
        self.new_outputs = job.get("new_outputs", False)
        self.rank, self.size = pc.rank(), pc.world_size()
        # The auto+new row's calls go through a group of their own: auto keeps a measured
        # choice per group and call shape, and a program makes its calls one way or the other,
        # not both, so each row's trial sees only its own calls.
        self.new_outputs_group = (
            pc.new_group(list(range(self.size))) if job.get("new_outputs_row") else None
        )

    def barrier(self) -> None:
        self.pc.barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        return self.pc.allreduce(values, op="max", algo="ring")

    def sum_over_ranks(self, value: int) -> int:
        return int(self.pc.allreduce(np.array([value], np.int64), algo="ring")[0])

    def call(self, collective: str, x: np.ndarray, out: np.ndarray | None, algo: str, op: str):
        pc = self.pc
        if self.new_outputs:
            out = None  # every call returns a new result array
        if algo == AUTO_NEW_OUTPUTS:
            if collective != "allreduce":
                raise ValueError("the auto+new row runs allreduce only")
            group = self.new_outputs_group
            return lambda: group.allreduce(x, op=op)
        if algo in (PREPARED, SHARED):
            if collective != "allreduce":
                raise ValueError("prepared calls run allreduce only")
            if algo == SHARED:  # the same contents in shared arrays, prepared alike
                x, x_private = pc.shared_empty(x.shape, x.dtype), x
                x[...] = x_private
                out = None if out is None else pc.shared_empty(out.shape, out.dtype)
            return pc.prepare_allreduce(x, op=op, out=out)
        if collective == "allreduce":
            return lambda: pc.allreduce(x, op=op, algo=algo, out=out)
        if collective == "reduce_scatter":
            return lambda: pc.reduce_scatter(x, op=op, algo=algo, out=out)
        if collective == "allgather":
            return lambda: pc.allgather(x, algo=algo, out=out)
        if collective == "broadcast":
            return lambda: pc.broadcast(x, root=0, algo=algo, out=out)
        return lambda: pc.reduce(x, root=0, op=op, algo=algo, out=out if self.rank == 0 else None)

    def _group_of(self, algo: str):
        return self.new_outputs_group if algo == AUTO_NEW_OUTPUTS else self.group

    def chosen(self, collective: str, nbytes: int, algo: str = "auto") -> tuple[str, str]:
        """The algorithm algo="auto" runs for this call (in the group of ``algo``'s row), and
        how it measures there (how_auto_measures)."""
        explained = self._group_of(algo).explain(collective, nbytes)
        return explained.split()[0], how_auto_measures(explained)

    def settle(self, call, algo: str = "auto") -> None:
        """auto's trial, where it measures (a training loop's first steps): its row is timed
        from its settled choice on, as every algorithm after its warm-up. Each trial call
        follows a barrier, as each timed call does, so that the trial times the calls the row
        will."""
        for _ in range(self._group_of(algo).auto_trial_calls):
            self.barrier()
            call()

    def close(self) -> None:
        self.pc.shutdown()


class GlooBackend:
    """torch.distributed with the gloo backend, the CPU default of PyTorch."""

    def __init__(self, job: dict) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        from pycollective import config  # the launcher's rank variables, from the one table

        self.rank = int(config.get("PYCOLLECTIVE_RANK"))
        self.size = int(config.get("PYCOLLECTIVE_WORLD_SIZE"))
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{job['peer_port']}",
            rank=self.rank,
            world_size=self.size,
        )

    def barrier(self) -> None:
        self.dist.barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        t = self.torch.from_numpy(values.copy())
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.numpy()

    def sum_over_ranks(self, value: int) -> int:
        t = self.torch.tensor([value], dtype=self.torch.int64)
        self.dist.all_reduce(t)
        return int(t[0])

    def _tensor(self, x: np.ndarray):
        """x as a torch tensor on the same memory (numpy's bfloat16, from ml_dtypes, through
        an int16 view: torch.from_numpy does not know it)."""
        if x.dtype.name == "bfloat16":
            return self.torch.from_numpy(x.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(x)

    def _array(self, t, like: np.ndarray) -> np.ndarray:
        """A result tensor as numpy, in ``like``'s dtype (bfloat16 back through int16)."""
        if like.dtype.name == "bfloat16":
            return t.view(self.torch.int16).numpy().view(like.dtype)
        return t.numpy()

    def call(self, collective: str, x: np.ndarray, out, algo: str, op: str):
        dist, torch = self.dist, self.torch
        t = self._tensor(x)
        ops = {
            "sum": dist.ReduceOp.SUM,
            "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN,
            "prod": dist.ReduceOp.PRODUCT,
        }
        if collective not in ("allreduce", "reduce_scatter", "allgather") or (
            collective != "allgather" and op not in ops
        ):
            raise ValueError(
                "the gloo peer runs allreduce and reduce_scatter with sum/min/max/prod, "
                "and allgather"
            )
        if collective == "reduce_scatter":
            if t.numel() % self.size:
                raise ValueError("the gloo peer's reduce_scatter needs equal shares")
            result = torch.empty(t.numel() // self.size, dtype=t.dtype)

            def reduce_scatter():
                dist.reduce_scatter_tensor(result, t, op=ops[op])
                return self._array(result, x)

            return reduce_scatter
        if collective == "allgather":
            # all_gather_single is the name all_gather_into_tensor took in PyTorch 2.13.
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            result = torch.empty(t.numel() * self.size, dtype=t.dtype)

            def allgather():
                gather(result, t)
                return self._array(result, x)

            return allgather
        # gloo reduces in place; copy the input first, as our out= calls leave it untouched.
        work = t.clone()

        def run():
            work.copy_(t)
            dist.all_reduce(work, op=ops[op])
            return self._array(work, x)

        return run

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiBackend:
    """mpi4py over the system MPI (started with mpirun)."""

    def __init__(self, job: dict) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=self.MPI.MAX)
        return out

    def sum_over_ranks(self, value: int) -> int:
        return int(self.comm.allreduce(value))

    def call(self, collective: str, x: np.ndarray, out, algo: str, op: str):
        ops = {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN, "prod": self.MPI.PROD}
        if collective == "allgather":

            def allgather():
                self.comm.Allgather(x, out)
                return out

            return allgather
        if collective not in ("allreduce", "reduce_scatter") or op not in ops:
            raise ValueError(
                "the MPI peer runs allreduce and reduce_scatter with sum/min/max/prod, "
                "and allgather"
            )
        if collective == "reduce_scatter":
            from pycollective._calls import chunk_bounds  # our shares, by the native rule

            bounds = [chunk_bounds(x.size, self.size, r) for r in range(self.size)]
            counts = [stop - start for start, stop in bounds]

            def reduce_scatter():
                self.comm.Reduce_scatter(x, out, counts, op=ops[op])
                return out

            return reduce_scatter

        def run():
            self.comm.Allreduce(x, out, op=ops[op])
            return out

        return run

    def close(self) -> None:
        pass


class TensorFlowBackend:
    """TensorFlow's MultiWorkerMirroredStrategy with RING communication (one replica per
    worker): the all-reduce a tf.distribute user gets, called through a tf.function."""

    def __init__(self, job: dict) -> None:
        from pycollective import config  # the launcher's rank variables, from the one table

        self.rank = int(config.get("PYCOLLECTIVE_RANK"))
        self.size = int(config.get("PYCOLLECTIVE_WORLD_SIZE"))
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{p}" for p in job["tf_ports"][: self.size]]},
                "task": {"type": "worker", "index": self.rank},
            }
        )
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self.tf = tf
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        self._fns: dict[str, object] = {}

    def _step(self, kind: str):
        """A compiled step: each worker's value as a per-replica value, then strategy.reduce
        (an all-reduce across the workers) or strategy.gather (tf.distribute's ReduceOp has only
        SUM and MEAN, so max goes through gather)."""
        if kind not in self._fns:
            tf, s = self.tf, self.strategy

            def step(x):
                per_replica = s.run(tf.identity, args=(x,))
                if kind == "gather":
                    return s.gather(per_replica, axis=0)
                return s.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._fns[kind] = tf.function(step)
        return self._fns[kind]

    def _run(self, kind: str, x: np.ndarray) -> np.ndarray:
        return self._step(kind)(self.tf.constant(x)).numpy()

    def barrier(self) -> None:
        self._run("sum", np.zeros(1, np.float32))

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        return self._run("gather", values).reshape(self.size, -1).max(axis=0)

    def sum_over_ranks(self, value: int) -> int:
        return int(self._run("sum", np.array([value], np.float64))[0])

    def call(self, collective: str, x: np.ndarray, out, algo: str, op: str):
        if collective != "allreduce" or op != "sum":
            raise ValueError("the TensorFlow peer runs allreduce with sum only")
        return lambda: self._run("sum", x)

    def close(self) -> None:
        pass


BACKENDS = {
    "pycollective": PycollectiveBackend,
    "gloo": GlooBackend,
    "mpi": MpiBackend,
    "tensorflow": TensorFlowBackend,
}


def _chosen(backend, call, algo: str, job: dict, nbytes: int) -> tuple[str | None, str]:
    """The algorithm auto ran (auto's row: the group's explain; the prepared and shared rows:
    their plan's), and how auto measures there (how_auto_measures)."""
    if algo in (PREPARED, SHARED):
        return call.algorithm, ""
    if algo in AUTO_ROWS:
        return backend.chosen(job["collective"], nbytes, algo)
    return None, ""


#: The row name of Open MPI's call when it is timed in our ranks (job key "with_mpi").
MPI_IN_JOB = "mpi"


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    backend = BACKENDS[job["backend"]](job)
    # Open MPI's Allreduce timed in these same processes (started by mpirun), interleaved with
    # ours round by round: both see the same machine, where separate launches see different
    # minutes of a shared one.
    mpi = MpiBackend(job) if job.get("with_mpi") else None
    rank, n = backend.rank, backend.size
    itemsize = np_dtype(job["dtype"]).itemsize
    rows = []
    skipped: set[str] = set()
    for nbytes in job["sizes"]:
        count = max(1, nbytes // itemsize)
        if job["collective"] == "allgather":
            count = max(1, count // n)
        x = rank_input(rank, count, job["dtype"])
        out = out_buffer(job["collective"], n, rank, count, job["dtype"])
        want = expected(job["collective"], job["op"], n, count, job["dtype"], rank)
        calls, wrong = {}, {}
        for algo in job["algos"]:
            poison(out)
            try:
                call = backend.call(job["collective"], x, out, algo, job["op"])
                result = call()
            except ValueError as exc:  # the same on every rank: this algorithm cannot run it
                if rank == 0 and algo not in skipped:  # once: its reason names the limit
                    print(f"skip {algo} from {human_bytes(count * itemsize)}: {exc}", flush=True)
                skipped.add(algo)
                continue
            wrong[algo] = backend.sum_over_ranks(count_wrong(result, want, job["op"]))
            calls[algo] = call
            if algo in AUTO_ROWS:
                backend.settle(call, algo)
        barriers = dict.fromkeys(calls, backend.barrier)
        if mpi is not None:
            poison(out)
            call = mpi.call(job["collective"], x, out, MPI_IN_JOB, job["op"])
            wrong[MPI_IN_JOB] = backend.sum_over_ranks(count_wrong(call(), want, job["op"]))
            calls[MPI_IN_JOB], barriers[MPI_IN_JOB] = call, mpi.barrier  # each after its own
        samples = time_interleaved(
            calls,
            job["iters"],
            job["warmup"],
            job["budget"],
            before_each=barriers,
            max_over_ranks=backend.max_over_ranks,
        )
        look = second_look(
            calls,
            samples,
            "auto",
            {MPI_IN_JOB, SHARED, AUTO_NEW_OUTPUTS},
            job["iters"],
            job["budget"],
            before_each=barriers,
            max_over_ranks=backend.max_over_ranks,
        )
        for algo, times in samples.items():
            if rank == 0:
                t = summarize(times)
                chose, measures = _chosen(backend, calls[algo], algo, job, count * itemsize)
                rows.append(
                    {
                        "nbytes": count * itemsize * (n if job["collective"] == "allgather" else 1),
                        "count": count,
                        "algo": algo,
                        "median_s": t.median,
                        "p10_s": t.p10,
                        "p90_s": t.p90,
                        "wrong": wrong[algo],
                        "chose": chose,
                        "measures": measures,
                        "peer": algo == MPI_IN_JOB and mpi is not None,
                        "second_look": look.as_dict() if algo == "auto" and look else None,
                    }
                )
                print(f"done {job['backend']} {algo} {nbytes}", flush=True)
    backend.close()
    if rank == 0:
        with open(job["result"], "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
