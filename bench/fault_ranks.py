"""Jobs that get hurt on purpose: N ranks loop random collectives, each result checked against
numpy, while the harness kills or stops one of them; every other rank reports how it failed.

Used by the fault soak (bench/fault_soak.py) and its short version in CI
(tests/test_fault_suite.py). One round:

1. ``start_job`` spawns the ranks (``python -m pycollective.bench.fault_ranks``), each with
   the group's environment, in its own process group; each prints ``READY`` once it formed the
   group and then runs collectives chosen by the round's seed (the same on every rank:
   collective, size, dtype, algorithm);
2. the harness hurts one rank (``hurt``: SIGKILL, or SIGSTOP then SIGCONT) at a random moment;
3. ``finish`` waits for every other rank under a hard deadline (a rank still running then is a
   hang: killed and reported) and reads each one's report: the collectives it completed, the
   results that differed from numpy (must be 0), and the error it raised (type, message,
   CLOCK_MONOTONIC time, which is system-wide on Linux: comparable with the harness's).
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from pycollective._ports import PortReservation
from pycollective._spawn import child_environment, in_own_process_group, python_module_command

from .netns_cluster import NetnsCluster

TRANSPORTS = ("tcp", "shm", "grpc", "tcp+aes")
ALLREDUCE_ALGOS = ("ring", "halving_doubling", "reduce_to_one", "auto")
COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce_scatter")


@dataclass
class Job:
    procs: list[subprocess.Popen]
    transport: str
    seed: int
    ports: PortReservation
    logs: list[str] = field(default_factory=list)


def start_job(
    world: int,
    transport: str,
    seed: int,
    env: dict[str, str] | None = None,
    cluster: NetnsCluster | None = None,
) -> Job:
    """Spawns ``world`` ranks that loop collectives until they fail; returns once every rank
    formed the group (raises RuntimeError, with their output, when one did not within 60 s).
    With ``cluster``, the ranks run in its namespace hosts, started the torchrun way."""
    ports = PortReservation(1)
    token = secrets.token_hex(16)
    procs = []
    for rank in range(world):
        e = child_environment()
        e.update(
            PYCOLLECTIVE_TRANSPORT=transport.split("+")[0],
            PYCOLLECTIVE_DATA_ENCRYPT="1" if transport.endswith("+aes") else "0",
            PYTHONUNBUFFERED="1",
        )
        e.update(env or {})
        command = python_module_command("pycollective.bench.fault_ranks", str(seed))
        if cluster is not None:
            e = cluster.rank_environment(rank, token, e)
            command = cluster.rank_command(rank, command)
        else:
            e.update(
                PYCOLLECTIVE_RANK=str(rank),
                PYCOLLECTIVE_WORLD_SIZE=str(world),
                PYCOLLECTIVE_MASTER_ADDR="127.0.0.1",
                PYCOLLECTIVE_MASTER_PORT=str(ports.ports[0]),
                PYCOLLECTIVE_TOKEN=token,
            )
        procs.append(
            subprocess.Popen(
                command,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                **in_own_process_group(),
            )
        )
    job = Job(procs, transport, seed, ports)
    deadline = time.monotonic() + 60
    for p in procs:
        line = ""
        while time.monotonic() < deadline and p.stdout is not None:
            line = p.stdout.readline()
            if line.startswith("READY") or line == "":
                break
        if not line.startswith("READY"):
            reports = finish(job, timeout=1)
            # Each rank's exit code (negative: the signal that ended it) beside its output: a
            # rank that left no output at all (seen once in CI) says at least how it ended.
            ends = ", ".join(
                f"rank {r}: {'hung' if rep.get('hung') else 'exit ' + str(rep.get('exit'))}"
                for r, rep in enumerate(reports)
            )
            raise RuntimeError(f"a rank did not form the group ({ends}):\n{''.join(job.logs)}")
    return job


def hurt(job: Job, rank: int, how: str, stopped_s: float = 0.0) -> float:
    """SIGKILLs ``rank`` (how="kill") or stops it for ``stopped_s`` seconds (how="stop"; this
    returns after SIGCONT). Returns CLOCK_MONOTONIC at the fault."""
    pid = job.procs[rank].pid
    at = time.monotonic()
    if how == "kill":
        os.kill(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stopped_s)
        os.kill(pid, signal.SIGCONT)
    return at


def finish(job: Job, timeout: float, stop_after: float | None = None) -> list[dict]:
    """Waits for every rank under a hard deadline; returns one report per rank: its "exit"
    code (negative: killed by that signal), "hung" when it had to be killed, and what the rank
    reported (see the module docstring). ``stop_after``: seconds after which the ranks are told
    to stop looping (SIGUSR1) and leave cleanly, for rounds whose ranks should all survive."""
    start = time.monotonic()
    if stop_after is not None:
        time.sleep(max(0.0, stop_after))
        for p in job.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGUSR1)
    deadline = start + timeout + (stop_after or 0)
    reports = []
    for p in job.procs:
        hung = False
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            out = _stacks_then_kill(p)
        job.logs.append(out or "")
        report: dict = {"exit": p.returncode, "hung": hung}
        if hung:
            report["output_tail"] = (out or "")[-4000:]  # the stacks it was asked for, last
        for line in (out or "").splitlines():
            if line.startswith("REPORT "):
                # raw_decode: another thread's output (a gRPC log line on stderr, which shares
                # the pipe) may have landed right after the report, on the same line.
                report.update(json.JSONDecoder().raw_decode(line[7:])[0])
        reports.append(report)
    job.ports.close()
    return reports


def _stacks_then_kill(p: subprocess.Popen) -> str:
    """Asks a hung rank for every thread's Python stack (faulthandler, on SIGUSR2), so the log
    says where it waited, then kills its process group; returns its whole output."""
    try:
        os.kill(p.pid, signal.SIGUSR2)
        out, _ = p.communicate(timeout=2.0)
        return out or ""  # it exited on its own meanwhile
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return out or ""


# -- the rank side ------------------------------------------------------------------------------


def _call(pc, np, rng: random.Random, rank: int, world: int) -> bool:
    """One random collective with a numpy reference; False when the result is wrong."""
    collective = rng.choice(COLLECTIVES)
    count = rng.choice((0, 1, 7, 1000, 65537, 1 << 20))
    dtype = rng.choice((np.float32, np.float64, np.int32))
    base = (np.arange(count) % 97).astype(dtype)
    if collective == "allreduce":
        got = pc.allreduce(base + rank, algo=rng.choice(ALLREDUCE_ALGOS))
        want = base * world + sum(range(world))
    elif collective == "allgather":
        got = np.ravel(pc.allgather(base + rank))
        want = np.concatenate([base + r for r in range(world)])
    elif collective == "broadcast":
        root = rng.randrange(world)
        got = pc.broadcast(base + rank, root=root)
        want = base + root
    else:
        part = max(1, count // world)
        x = (np.arange(part * world) % 89).astype(dtype) + rank
        got = pc.reduce_scatter(x)
        want = ((np.arange(part * world) % 89).astype(dtype) * world + sum(range(world)))[
            rank * part : (rank + 1) * part
        ]
    return bool(np.array_equal(np.asarray(got), want.astype(dtype)))


def _rank_main(seed: int) -> int:
    # The harness asks a rank it found hung where each thread waits (written by the signal
    # handler in C, so it answers while the main thread is blocked in a native call). Set
    # before the imports, so that a rank stuck importing answers too.
    faulthandler.register(signal.SIGUSR2, file=sys.stdout, all_threads=True)
    import numpy as np

    import pycollective as pc

    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(True))
    pc.init()  # PYCOLLECTIVE_TIMEOUT, set by the harness
    rank, world = pc.rank(), pc.world_size()
    print("READY", flush=True)
    rng = random.Random(seed)  # the same sequence of calls on every rank
    report: dict = {"calls": 0, "wrong": 0, "error": None}
    try:
        while True:
            # Every rank stops after the same call: the one where the first asked it to.
            if pc.allreduce(np.array([len(stop)], np.int32), algo="ring")[0] > 0:
                break
            if not _call(pc, np, rng, rank, world):
                report["wrong"] += 1
            report["calls"] += 1
    except Exception as exc:  # noqa: BLE001 - reported to the harness, which judges it
        report["error"] = {"type": type(exc).__name__, "message": str(exc), "at": time.monotonic()}
    print("REPORT " + json.dumps(report), flush=True)
    if report["error"] is None:
        pc.shutdown()
    # After a failure, exit as a program that caught the error would: the exit hooks leave the
    # group (and on rank 0 stop the coordinator). A hang there is a hang the harness reports.
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(int(sys.argv[1])))
