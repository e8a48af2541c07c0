"""Multi-process suite: `world` local processes run each algorithm over each transport, and the
peers (torch.distributed gloo, MPI) run the same sizes in the same run.

Each run is one set of rank processes (bench/worker.py) under a hard deadline; rank 0 writes
its rows to a file. A peer that is not installed is skipped with a one-line reason."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from pycollective._ports import PortReservation
from pycollective._spawn import child_environment, in_own_process_group, python_module_command

from .rows import Row

# A Python exception's last line ("TypeError: ..."), as a rank prints it before it exits.
_EXCEPTION_LINE = re.compile(r"^\w+(\.\w+)*(Error|Exception|Interrupt|Exit)\b.*:")


def _spawn_ranks(
    job: dict, world: int, deadline_s: float, progress: Callable[[str], None]
) -> list[dict]:
    """Runs one job on `world` processes; returns rank 0's rows."""
    # Ports for the coordinator, the peers' torch store and TensorFlow's servers, held until the
    # ranks are gone (pycollective/_ports.py).
    with PortReservation(world + 2) as reserved:
        return _run_ranks(job, world, deadline_s, progress, reserved.ports)


def _run_ranks(
    job: dict, world: int, deadline_s: float, progress: Callable[[str], None], ports: list[int]
) -> list[dict]:
    # The job's folder goes with the call: a failure's reason and log tail are in the error.
    with tempfile.TemporaryDirectory(prefix="pycol-bench-", ignore_cleanup_errors=True) as tmp:
        return _run_job_in(tmp, job, world, deadline_s, progress, ports)


def _run_job_in(
    tmp: str,
    job: dict,
    world: int,
    deadline_s: float,
    progress: Callable[[str], None],
    ports: list[int],
) -> list[dict]:
    port, peer_port, *tf_ports = ports
    job = dict(
        job,
        result=os.path.join(tmp, "rows.json"),
        peer_port=peer_port,
        tf_ports=tf_ports,
    )
    job_path = os.path.join(tmp, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    cmd = python_module_command("pycollective.bench.worker", job_path)
    if job["backend"] == "mpi" or job.get("with_mpi"):
        env = dict(
            child_environment(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"
        )
        procs = [
            subprocess.Popen(
                ["mpirun", "-n", str(world), "--oversubscribe"] + cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                **in_own_process_group(),
            )
        ]
    else:
        token = secrets.token_hex(8)
        procs = []
        for r in range(world):
            env = dict(
                child_environment(),
                PYCOLLECTIVE_RANK=str(r),
                PYCOLLECTIVE_WORLD_SIZE=str(world),
                PYCOLLECTIVE_MASTER_ADDR="127.0.0.1",
                PYCOLLECTIVE_MASTER_PORT=str(port),
                PYCOLLECTIVE_TOKEN=token,
            )
            if job.get("host_ids"):  # fake hosts on one machine (hierarchical experiments)
                env["PYCOLLECTIVE_HOST_ID"] = job["host_ids"][r]
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    **in_own_process_group(),
                )
            )
    log: list[str] = []
    deadline = time.monotonic() + deadline_s
    os.set_blocking(procs[0].stdout.fileno(), False)
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            if line:
                log.append(line.rstrip())
                if line.startswith("done"):
                    progress(line[5:].strip())
                elif line.startswith("skip"):  # a row that cannot run: the table's notes say why
                    progress(line.strip())
            else:
                time.sleep(0.02)
    finally:
        # Past the deadline, and on Ctrl-C: the ranks are in process groups of their own, which
        # the terminal's interrupt does not reach (they ran on, orphaned, when it stopped bench).
        kill_rank_groups(procs)
    rest = procs[0].stdout.read() or ""
    log.extend(rest.splitlines())
    for p in procs[1:]:
        log.extend((p.stdout.read() or "").splitlines())
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed or not os.path.exists(job["result"]):
        over = f" over {job['transport']}" if job.get("transport") else ""
        what = (
            f"ranks {failed} failed"
            if time.monotonic() < deadline
            else f"ranks {failed} did not finish within {deadline_s:.0f} s"
        )
        # The first line carries the reason (a peer's note keeps that line alone): the last
        # exception a rank printed.
        errors = [line for line in log if _EXCEPTION_LINE.match(line)]
        reason = f": {errors[-1]}" if errors else ""
        raise RuntimeError(f"{job['backend']}{over}: {what}{reason}\n" + "\n".join(log[-20:]))
    with open(job["result"]) as f:
        return json.load(f)


def kill_rank_groups(procs: list[subprocess.Popen]) -> None:
    """Kills every rank of `procs` still running, with its process group, and reaps them all."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def peer_status(name: str) -> str | None:
    """None when the peer can run here, else why not (one line)."""
    if name == "gloo":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install torch)"
        return None
    if name == "mpi":
        if shutil.which("mpirun") is None:
            return "no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)"
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py)"
        return None
    if name == "tensorflow":
        if importlib.util.find_spec("tensorflow") is None:
            return "tensorflow is not installed (pip install tensorflow-cpu)"
        return None
    return f"unknown peer {name!r}"


def run(
    collective: str,
    sizes: list[int],
    dtype: str,
    op: str,
    world: int,
    algos: list[str],
    transports: list[str],
    peers: list[str],
    iters: int,
    warmup: int,
    budget_s: float,
    progress: Callable[[str], None],
    notes: list[str],
    host_ids: list[str] | None = None,
    new_outputs: bool = False,
    new_outputs_row: bool = False,
    rounds: int = 1,
    mpi_in_job: bool = False,
    before_round: Callable[[], None] | None = None,
) -> list[Row]:
    """Rows of every algorithm over every transport, then of every peer. With ``rounds`` > 1
    the launches alternate (ours, the peers, ours, ...) and each row gives the median of its
    rounds' medians, the lowest p10 and the highest p90: a machine whose load drifts over
    minutes then weighs on both sides of a ratio alike, not on whichever ran last.

    ``mpi_in_job``: the shm ranks are started by mpirun and time Open MPI's Allreduce in the
    same processes, interleaved with ours (each call after its own library's barrier), instead
    of in a launch of their own.

    ``before_round``: called at the start of every round, so that what it measures (the
    benchmark's TCP ceilings) drifts with the machine as the rows do."""
    job = {
        "collective": collective,
        "sizes": sizes,
        "dtype": dtype,
        "op": op,
        "iters": iters,
        "warmup": warmup,
        "budget": budget_s,
        "new_outputs": new_outputs,
        "new_outputs_row": new_outputs_row,
    }
    # A safety net against hangs, not a budget: every (size, algorithm) gets about budget_s of
    # timing but at least one iteration per round, and the largest sizes over slow transports
    # take longer than budget_s / ROUNDS per call.
    deadline = 120 + 8 * budget_s * len(sizes) * max(1, len(algos))
    rows: list[Row] = []
    # (transport, is_peer, nbytes, algo) -> the raw result of each round
    results: dict[tuple[str, bool, int, str], list[dict]] = {}

    def add(raw: list[dict], transport: str, peer: bool) -> None:
        for d in raw:
            key = (transport, peer or bool(d.get("peer")), d["nbytes"], d["algo"])
            results.setdefault(key, []).append(d)

    runnable: list[str] = []
    for peer in peers:
        why = peer_status(peer)
        if why is None:
            runnable.append(peer)
        else:
            notes.append(f"peer {peer} skipped: {why}")
    in_job = mpi_in_job and "mpi" in runnable and "shm" in transports
    if mpi_in_job and not in_job:
        notes.append("--mpi-in-job ignored: it needs the mpi peer and the shm transport")
    elif in_job:
        notes.append("mpi timed in our shm ranks (started by mpirun), interleaved with ours")
    for _ in range(rounds):
        if before_round is not None:
            before_round()
        for transport in transports:
            ours = dict(
                job,
                backend="pycollective",
                transport=transport,
                algos=algos,
                host_ids=host_ids,
                with_mpi=in_job and transport == "shm",
            )
            raw = _spawn_ranks(ours, world, deadline, progress)
            add(raw, transport, False)
        for peer in [p for p in runnable if not (in_job and p == "mpi")]:
            try:
                raw = _spawn_ranks(dict(job, backend=peer, algos=[peer]), world, deadline, progress)
            except RuntimeError as exc:
                notes.append(f"peer {peer} failed: {str(exc).splitlines()[0]}")
                runnable.remove(peer)
                continue
            add(raw, {"gloo": "tcp", "tensorflow": "grpc"}.get(peer, "shm"), True)
    for (transport, peer, _, _), runs in results.items():
        first = runs[0]
        extra = {"chose": first["chose"]} if first.get("chose") else {}
        if first.get("measures"):
            extra["measures"] = first["measures"]
        looks = [d["second_look"] for d in runs if d.get("second_look")]
        if looks:  # with several rounds, the round whose second look gave the median ratio
            looks.sort(key=lambda look: look["median_s"] / look["best_median_s"])
            extra["second_look"] = looks[len(looks) // 2]
        rows.append(
            Row(
                collective,
                first["nbytes"],
                first["count"],
                dtype,
                first["algo"],
                transport,
                world,
                statistics.median(d["median_s"] for d in runs),
                min(d["p10_s"] for d in runs),
                max(d["p90_s"] for d in runs),
                sum(d["wrong"] for d in runs),
                peer=peer,
                extra=extra,
            )
        )
    return rows
