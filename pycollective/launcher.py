"""``pycollective run``: start N ranks on this machine, tag their output, stop them together.

Each rank gets the PYCOLLECTIVE_* variables that ``ClusterSpec.from_env``
reads first, a fresh cluster token, and a TF_CONFIG for TensorFlow-style
code. When one rank fails, the others are stopped (SIGTERM, then SIGKILL
after a grace period) and the launcher exits with the failed rank's code.

``pycollective run --ps N --workers M CMD`` starts a parameter-server cluster
instead: N ps and M worker tasks (ParameterServerStrategy's servers) and CMD as
the chief, one TF_CONFIG cluster and token for all; the chief's exit ends it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from pycollective._ports import PortReservation
from pycollective._spawn import child_environment, own_process_group, python_module_command

HELP = "start N ranks of a program on this machine"

# Exit code for --timeout, as timeout(1) uses.
TIMEOUT_EXIT_CODE = 124
# How often the launcher checks its ranks, deadline and signals.
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


# --tls-* flag, the variable it sets for every rank, and what it names.
_TLS_FLAGS = (
    ("--tls-cert", "PYCOLLECTIVE_TLS_CERT", "this host's certificate (chain)"),
    ("--tls-key", "PYCOLLECTIVE_TLS_KEY", "its private key"),
    ("--tls-ca", "PYCOLLECTIVE_TLS_CA", "the CA every peer's certificate must chain to"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the ``run`` subcommand's options."""
    parser.add_argument(
        "-n",
        "--nprocs",
        type=_rank_count,
        default=None,
        metavar="N|MIN:MAX",
        help="number of ranks to start; MIN:MAX makes an elastic job: MAX processes start, and "
        "while at least MIN live, a failed one does not stop the others, who re-form the group "
        "(pycollective.reinit()); see docs/launching.md",
    )
    parser.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="elastic job: start a replacement for up to N failed processes in all; each "
        "joins the re-formed group (default 0; implies an elastic job). With --ps/--workers: "
        "restart a ps or worker task that exits, on its address, up to N times in all",
    )
    parser.add_argument(
        "--rdzv-last-call",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="elastic job: a re-forming group waits at most S seconds for a live process that "
        "does not join (e.g. a hung one) once MIN have joined (default 30)",
    )
    parser.add_argument(
        "--ps",
        type=_positive_int,
        default=None,
        metavar="N",
        help="parameter-server cluster: start N ps tasks (with --workers; instead of -n); the "
        "command runs as the chief",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="M",
        help="parameter-server cluster: start M worker tasks (with --ps)",
    )
    parser.add_argument(
        "--host-ids",
        type=lambda text: [part.strip() for part in text.split(",")],
        default=None,
        metavar="A,A,B,B",
        help="host id of each rank, to fake several hosts on one machine "
        "(sets PYCOLLECTIVE_HOST_ID and the local rank/size from it)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help=f"stop every rank after S seconds and exit with {TIMEOUT_EXIT_CODE}",
    )
    parser.add_argument(
        "--grace",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)",
    )
    parser.add_argument(
        "--tag-output",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='prefix every output line with "[rank N] " (default: on)',
    )
    for flag, knob, what in _TLS_FLAGS:
        parser.add_argument(
            flag,
            default=None,
            metavar="PEM",
            help=f"mutual TLS on every gRPC connection of the job: {what} (sets {knob} for "
            "every rank; give all three)",
        )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the program and its arguments, e.g. python train.py --epochs 3",
    )


def main(args: argparse.Namespace) -> int:
    """Runs the ``run`` subcommand from parsed arguments; returns the exit code."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _say("no program given; e.g. pycollective run -n 4 python train.py")
        return 2
    tls_problem = _apply_tls_flags(args)
    if tls_problem:
        _say(tls_problem)
        return 2
    elastic = args.nprocs is not None and (
        args.nprocs[0] != args.nprocs[1] or args.max_restarts > 0
    )
    if args.ps is not None or args.workers is not None:
        if args.ps is None or args.workers is None or args.nprocs is not None:
            _say(
                "a parameter-server cluster takes both --ps N and --workers M (and no -n); "
                "e.g. pycollective run --ps 2 --workers 2 python coordinator.py"
            )
            return 2
        return launch_ps_cluster(
            command,
            args.ps,
            args.workers,
            max_restarts=args.max_restarts,
            timeout=args.timeout,
            tag_output=args.tag_output,
            grace=args.grace,
        )
    if args.nprocs is None:
        _say(
            "give the number of ranks, e.g. pycollective run -n 4 python train.py "
            "(or --ps N --workers M for a parameter-server cluster)"
        )
        return 2
    min_size, nprocs = args.nprocs
    if elastic:
        if args.host_ids is not None:
            _say("--host-ids fixes a host per rank; an elastic job re-ranks: drop one of them")
            return 2
        from pycollective.elastic_launch import launch_elastic

        return launch_elastic(
            command,
            min_size,
            nprocs,
            max_restarts=args.max_restarts,
            last_call=args.rdzv_last_call,
            timeout=args.timeout,
            tag_output=args.tag_output,
            grace=args.grace,
        )
    if args.host_ids is not None and len(args.host_ids) != nprocs:
        _say(
            f"--host-ids lists {len(args.host_ids)} host id(s) but -n is {nprocs}; "
            "give one host id per rank, e.g. --host-ids a,a,b,b for -n 4"
        )
        return 2
    return launch(
        command,
        nprocs,
        host_ids=args.host_ids,
        timeout=args.timeout,
        tag_output=args.tag_output,
        grace=args.grace,
    )


def _apply_tls_flags(args: argparse.Namespace) -> str:
    """Puts --tls-cert/--tls-key/--tls-ca into this process's environment, which every rank
    inherits (absolute paths: a rank may start elsewhere). Returns what is wrong, or ""."""
    given = {knob: getattr(args, flag[2:].replace("-", "_")) for flag, knob, _ in _TLS_FLAGS}
    named = {knob: path for knob, path in given.items() if path is not None}
    if not named:
        return ""
    if len(named) != len(_TLS_FLAGS):
        return "mutual TLS takes all three of --tls-cert, --tls-key and --tls-ca"
    for knob, path in named.items():
        if not os.path.isfile(path):
            flag = next(f for f, k, _ in _TLS_FLAGS if k == knob)
            return f"{flag} {path}: no such file"
        os.environ[knob] = os.path.abspath(path)
    return ""


def rank_environments(
    nprocs: int,
    host_ids: Sequence[str] | None = None,
    base: Mapping[str, str] | None = None,
    *,
    ports: Sequence[int],
) -> list[dict[str, str]]:
    """Builds each rank's environment: PYCOLLECTIVE_*, the token, TF_CONFIG and torch's
    env:// variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    Args:
        nprocs: Number of ranks.
        host_ids: Host id per rank, or None for one host.
        base: Environment to extend; ``os.environ`` when None.
        ports: ``nprocs + 1`` ports (``rank_ports(nprocs)``) held by the caller while the ranks
            run (``pycollective._ports.PortReservation``): one per TF_CONFIG worker (worker 0's
            is the coordinator's), then torch's env:// store.

    Returns:
        One environment per rank, in rank order.
    """
    base_env = child_environment(base)
    # All ranks share one token; a token already in the environment wins so
    # that a user can join ranks started elsewhere.
    token = base_env.get("PYCOLLECTIVE_TOKEN") or secrets.token_hex(16)
    # One port per TF_CONFIG worker, and one for torch.distributed's TCPStore (env://), so that
    # init_process_group("pycollective") works under `pycollective run` as under torchrun.
    if len(ports) != rank_ports(nprocs):
        raise ValueError(f"rank_environments needs {rank_ports(nprocs)} ports, got {len(ports)}")
    *ports, torch_port = ports
    hosts = list(host_ids) if host_ids is not None else ["localhost"] * nprocs
    workers = [f"127.0.0.1:{port}" for port in ports]
    environments = []
    for rank in range(nprocs):
        env = dict(base_env)
        same_host = [r for r in range(nprocs) if hosts[r] == hosts[rank]]
        env.update(
            PYCOLLECTIVE_RANK=str(rank),
            PYCOLLECTIVE_WORLD_SIZE=str(nprocs),
            PYCOLLECTIVE_LOCAL_RANK=str(same_host.index(rank)),
            PYCOLLECTIVE_LOCAL_SIZE=str(len(same_host)),
            PYCOLLECTIVE_MASTER_ADDR="127.0.0.1",
            # Worker 0 of TF_CONFIG is the coordinator too, at the same port.
            PYCOLLECTIVE_MASTER_PORT=str(ports[0]),
            PYCOLLECTIVE_TOKEN=token,
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
            ),
            RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_RANK=str(same_host.index(rank)),
            LOCAL_WORLD_SIZE=str(len(same_host)),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(torch_port),
        )
        if host_ids is not None:
            env["PYCOLLECTIVE_HOST_ID"] = hosts[rank]
        environments.append(env)
    return environments


def launch(
    command: Sequence[str],
    nprocs: int,
    *,
    host_ids: Sequence[str] | None = None,
    timeout: float | None = None,
    tag_output: bool = True,
    grace: float = 5.0,
) -> int:
    """Starts ``nprocs`` ranks of ``command`` and waits for them.

    Args:
        command: Program and arguments, e.g. ``["python", "train.py"]``.
        nprocs: Number of ranks.
        host_ids: Host id per rank to fake several hosts, or None.
        timeout: Seconds after which every rank is stopped, or None.
        tag_output: Prefix each output line with ``"[rank N] "``.
        grace: Seconds between SIGTERM and SIGKILL when stopping ranks.

    Returns:
        0 if every rank exited 0; the first failed rank's exit code (128+N
        for a rank killed by signal N); 124 on timeout; 128+N when the
        launcher itself received signal N.
    """
    # The ports stay reserved until the ranks are gone (pycollective/_ports.py).
    with PortReservation(rank_ports(nprocs)) as reserved:
        environments = rank_environments(nprocs, host_ids, ports=reserved.ports)
        return _launch_ranks(command, environments, timeout, tag_output, grace)


def rank_ports(nprocs: int) -> int:
    """How many ports rank_environments takes for ``nprocs`` ranks."""
    return nprocs + 1


def _launch_ranks(
    command: Sequence[str],
    environments: list[dict[str, str]],
    timeout: float | None,
    tag_output: bool,
    grace: float,
) -> int:
    if tag_output:
        for env in environments:
            # Piped Python output is block-buffered: lines would arrive late.
            env.setdefault("PYTHONUNBUFFERED", "1")
    group = _RankGroup(tag_output=tag_output, grace=grace)
    with _supervision(group) as received:
        try:
            for rank, env in enumerate(environments):
                group.start(rank, command, env)
        except OSError as exc:
            _say(f"cannot start {command[0]!r}: {exc}")
            group.stop_all()
            return 127
        return _supervise(group, received, timeout)


@contextlib.contextmanager
def _supervision(group: _RankGroup) -> Iterator[list[int]]:
    """Catches SIGINT/SIGTERM while ranks run (yields the signals received, for forwarding)
    and, however the block ends, stops ranks still running, drains their output and restores
    the previous handlers: an escaping exception never leaves ranks behind."""
    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield received
    finally:
        if not group.all_exited():
            group.stop_all()
        group.join_output()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(group: _RankGroup, received: list[int], timeout: float | None) -> int:
    """Waits for the ranks; reacts to the first failure, the timeout or a signal."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        stopped = _stop_on_signal(group, received, "ranks")
        if stopped is not None:
            return stopped
        exited = group.poll()
        failed = [r for r in exited if r.returncode != 0]
        if failed:
            first = failed[0]
            what, code = _describe_exit(first.returncode)
            group.stop_all(interrupts=received)
            _say(f"rank {first.rank} {what}; stopped the other ranks")
            return code
        if group.all_exited():
            return 0
        stopped = _stop_on_timeout(group, received, deadline, timeout, "ranks")
        if stopped is not None:
            return stopped
        time.sleep(_POLL_S)


def _stop_on_signal(group: _RankGroup, received: list[int], who: str) -> int | None:
    """When a signal came: forwards it to every process and returns the launcher's exit code."""
    if not received:
        return None
    signum = received[0]
    _say(f"received {signal.Signals(signum).name}; forwarded it to all {who}")
    group.stop_all(first_signal=signum, interrupts=received)
    return 128 + signum


def _stop_on_timeout(
    group: _RankGroup, received: list[int], deadline: float | None, timeout: float | None, who: str
) -> int | None:
    """Past the deadline: stops every process and returns the launcher's exit code."""
    if deadline is None or time.monotonic() < deadline:
        return None
    group.stop_all(interrupts=received)
    _say(f"timed out after {timeout:g} s; stopped all {who}")
    return TIMEOUT_EXIT_CODE


def _describe_exit(returncode: int) -> tuple[str, int]:
    """How a process ended, in words, and the exit code that passes it on (a shell's 128 + N
    for a signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name in the enum
            name = f"signal {-returncode}"
        return f"was killed by {name}", 128 - returncode
    return f"exited with code {returncode}", returncode


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen
    returncode: int | None = None
    pumps: list[threading.Thread] = field(default_factory=list)


class _RankGroup:
    """The child processes, each in its own process group, and their output pumps."""

    def __init__(self, tag_output: bool, grace: float) -> None:
        self.tag_output = tag_output
        self.grace = grace
        self.ranks: list[_Rank] = []
        self._exit_order: list[_Rank] = []
        self._locks = {"stdout": threading.Lock(), "stderr": threading.Lock()}

    def start(
        self, rank: int, command: Sequence[str], env: dict[str, str], label: str | None = None
    ) -> None:
        pipe = subprocess.PIPE if self.tag_output else None
        process = subprocess.Popen(
            list(command),
            env=env,
            # Ranks run in background process groups: one that read the terminal would be
            # stopped (SIGTTIN) and wait for good; from /dev/null it reads end of file.
            stdin=subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            # Own process group: the launcher decides who gets which signal,
            # and stopping a rank also stops whatever the rank started.
            preexec_fn=own_process_group(then=_die_with_parent(os.getpid())),
        )
        entry = _Rank(rank, process)
        self.ranks.append(entry)
        if self.tag_output:
            prefix = f"[{label or f'rank {rank}'}] ".encode()
            for name, stream in (("stdout", process.stdout), ("stderr", process.stderr)):
                pump = threading.Thread(
                    target=_pump,
                    args=(stream, _binary(name), prefix, self._locks[name]),
                    name=f"pc-run-{name}-{rank}",
                    daemon=True,
                )
                pump.start()
                entry.pumps.append(pump)

    def poll(self) -> list[_Rank]:
        """Ranks that have exited, in the order they were seen to exit."""
        for entry in self.ranks:
            if entry.returncode is None:
                code = entry.process.poll()
                if code is not None:
                    entry.returncode = code
                    self._exit_order.append(entry)
        return list(self._exit_order)

    def all_exited(self) -> bool:
        return all(entry.returncode is not None for entry in self.ranks)

    def stop_all(
        self, first_signal: int = signal.SIGTERM, interrupts: list[int] | None = None
    ) -> None:
        """Signals every rank's process group, then SIGKILLs what outlives the grace period.

        A further signal to the launcher during the grace period (a second
        Ctrl-C) skips the rest of the wait.
        """
        seen = len(interrupts) if interrupts is not None else 0
        self._signal_groups(first_signal)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self.poll()
            if self.all_exited():
                break
            if interrupts is not None and len(interrupts) > seen:
                break
            time.sleep(_POLL_S)
        # Also reaches the leftovers of ranks that already exited.
        self._signal_groups(signal.SIGKILL)
        for entry in self.ranks:
            try:
                entry.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        self.poll()

    def join_output(self) -> None:
        # A grandchild in another session may hold a pipe open: never wait long.
        end = time.monotonic() + 2.0
        for entry in self.ranks:
            for pump in entry.pumps:
                pump.join(timeout=max(0.0, end - time.monotonic()))

    def _signal_groups(self, signum: int) -> None:
        for entry in self.ranks:
            try:
                os.killpg(entry.process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


# Parameter-server clusters (``--ps N --workers M``) -------------------------------------------

# What ps and worker tasks run: Server(TFConfigClusterResolver()).join().
PS_TASK_MODULE = "pycollective.strategies.parameter_server"


def ps_cluster_environments(
    num_ps: int,
    num_workers: int,
    base: Mapping[str, str] | None = None,
    *,
    ports: Sequence[int],
) -> list[tuple[str, int, dict[str, str]]]:
    """Each task's ``(job, index, environment)`` for a local parameter-server cluster: the
    chief first, then the ps tasks, then the workers; one TF_CONFIG cluster, one token.
    ``ports``: one per task, held by the caller while the tasks run
    (``pycollective._ports.PortReservation``)."""
    base_env = child_environment(base)
    token = base_env.get("PYCOLLECTIVE_TOKEN") or secrets.token_hex(16)
    if len(ports) != 1 + num_ps + num_workers:
        raise ValueError(f"ps_cluster_environments needs {1 + num_ps + num_workers} ports")
    ports = iter(ports)
    cluster = {
        "chief": [f"127.0.0.1:{next(ports)}"],
        "ps": [f"127.0.0.1:{next(ports)}" for _ in range(num_ps)],
        "worker": [f"127.0.0.1:{next(ports)}" for _ in range(num_workers)],
    }
    tasks = [("chief", 0)] + [("ps", i) for i in range(num_ps)]
    tasks += [("worker", i) for i in range(num_workers)]
    environments = []
    for job, index in tasks:
        env = dict(base_env)
        env["PYCOLLECTIVE_TOKEN"] = token
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        environments.append((job, index, env))
    return environments


def launch_ps_cluster(
    command: Sequence[str],
    num_ps: int,
    num_workers: int,
    *,
    max_restarts: int = 0,
    timeout: float | None = None,
    tag_output: bool = True,
    grace: float = 5.0,
) -> int:
    """Starts ``num_ps`` ps and ``num_workers`` worker tasks (``python -m
    pycollective.strategies.parameter_server``) and ``command`` as the chief; stops every task
    when the chief exits and returns the chief's exit code. A ps or worker task that exits is
    reported, not fatal: the chief decides. While ``max_restarts`` (in all) are left, the
    task is started again on its address, with the same TF_CONFIG: a worker rejoins, and a ps
    task comes back empty (the coordinator restores it from a checkpoint: see
    ClusterCoordinator.enable_checkpointing)."""
    group = _RankGroup(tag_output=tag_output, grace=grace)
    reserved = PortReservation(1 + num_ps + num_workers)  # until the cluster is gone
    with reserved, _supervision(group) as received:
        tasks = ps_cluster_environments(num_ps, num_workers, ports=reserved.ports)
        labels = [f"{job} {index}" if job != "chief" else "chief" for job, index, _ in tasks]
        try:
            # The ps and worker tasks first: the chief connects to them.
            for n in list(range(1, len(tasks))) + [0]:
                job, _, env = tasks[n]
                if tag_output:
                    env.setdefault("PYTHONUNBUFFERED", "1")
                argv = list(command) if job == "chief" else python_module_command(PS_TASK_MODULE)
                group.start(n, argv, env, label=labels[n])
        except OSError as exc:
            _say(f"cannot start {command[0]!r}: {exc}")
            group.stop_all()
            return 127
        chief = group.ranks[-1]
        deadline = None if timeout is None else time.monotonic() + timeout
        reported: set[int] = set()  # id() of the exited task processes already handled
        restarts_left = max_restarts
        while True:
            if received:
                signum = received[0]
                _say(f"received {signal.Signals(signum).name}; stopping the cluster")
                group.stop_all(first_signal=signum, interrupts=received)
                return 128 + signum
            for entry in group.poll():
                if entry is chief or id(entry) in reported:
                    continue
                reported.add(id(entry))
                what, _ = _describe_exit(entry.returncode or 0)
                if restarts_left > 0 and chief.returncode is None:
                    restarts_left -= 1
                    env = tasks[entry.rank][2]
                    try:
                        group.start(
                            entry.rank,
                            python_module_command(PS_TASK_MODULE),
                            env,
                            label=labels[entry.rank],
                        )
                    except OSError as exc:
                        _say(f"cannot restart {labels[entry.rank]}: {exc}")
                        continue
                    _say(
                        f"{labels[entry.rank]} {what}; restarted it on its address "
                        f"({restarts_left} restart(s) left)"
                    )
                else:
                    _say(f"{labels[entry.rank]} {what}; the chief continues")
            if chief.returncode is not None:
                group.stop_all(interrupts=received)
                code = chief.returncode
                return 128 - code if code < 0 else code
            if deadline is not None and time.monotonic() >= deadline:
                group.stop_all(interrupts=received)
                _say(f"timed out after {timeout:g} s; stopped the cluster")
                return TIMEOUT_EXIT_CODE
            time.sleep(_POLL_S)


def _pump(stream: BinaryIO, sink: BinaryIO, prefix: bytes, lock: threading.Lock) -> None:
    """Copies one child stream line by line, each line prefixed and written whole."""
    try:
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with lock:
                sink.write(prefix + line)
                sink.flush()
    except (OSError, ValueError):
        pass  # our own stdout closed (e.g. a closed pipe): nothing left to do
    finally:
        stream.close()


def _binary(name: str) -> BinaryIO:
    stream = getattr(sys, name)
    return getattr(stream, "buffer", stream)


def _die_with_parent(parent_pid: int):
    """A preexec_fn that makes the child die if the launcher is killed (Linux only).

    SIGKILL on the launcher cannot be forwarded; without this the ranks, in
    their own sessions, would outlive it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def _say(message: str) -> None:
    print(f"pycollective run: {message}", file=sys.stderr, flush=True)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _rank_count(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (an elastic job) as (min, max)."""
    low, sep, high = text.partition(":")
    try:
        counts = (int(low), int(high)) if sep else (int(text), int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from None
    if not sep and counts[0] < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {counts[0]}")
    if not 1 <= counts[0] <= counts[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return counts


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
