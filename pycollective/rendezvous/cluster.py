"""Where a process group comes from: ``ClusterSpec`` and the launcher environments.

``ClusterSpec.from_env`` reads, in this order, the first environment that is
present: pycollective's own launcher (``pycollective run``), ``TF_CONFIG``,
torchrun, Open MPI, Slurm. Explicit arguments override single fields of
whichever source was found. Every bad input raises ``ValueError`` naming the
variable, the source it came from, and the shape that was expected.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .token_file import read_token_file

# Torch owns MASTER_PORT: torchrun's agent already serves a TCPStore on it
# (TORCHELASTIC_USE_AGENT_STORE) and torch.distributed binds it on rank 0.
# Our coordinator takes the next port so both can live in one job.
TORCH_MASTER_PORT_OFFSET = 1

# Slurm gives no port; every rank derives the same one from the job and step ids: 10 ports per
# job (one per step, so the steps of a job may run at once) for 1000 jobs in a row.
SLURM_PORT_BASE = 20000
SLURM_PORT_JOBS = 1000
SLURM_PORT_STEPS = 10

# Where a same-host launch's coordinator listens: loopback, on a port rank 0's OS picks.
SAME_HOST_MASTER = "127.0.0.1"

_TOKEN_HINT = (
    "write a token file once with `pycollective token --create` (readable by you alone; on a "
    "cluster with shared home directories every node then finds it), or set PYCOLLECTIVE_TOKEN "
    "to the same secret on every rank, or launch with `pycollective run`, which generates one "
    "(docs/launching.md)"
)

_PYCOLLECTIVE_SOURCE = "pycollective launcher environment (PYCOLLECTIVE_*)"

_TF_CONFIG_EXAMPLE = json.dumps(
    {
        "cluster": {
            "chief": ["host0:2222"],
            "worker": ["host1:2222", "host2:2222"],
        },
        "task": {"type": "worker", "index": 0},
    }
)


@dataclass(frozen=True)
class ClusterSpec:
    """This process's place in a process group and how to reach the coordinator.

    Attributes:
        rank: This process's rank in ``[0, world_size)``.
        world_size: Number of processes in the group.
        local_rank: Rank among the processes on this host, or None when the
            launcher did not say (the process group then derives it from the
            host ids in the peer table).
        local_size: Number of processes on this host, or None (as above).
        master_addr: Host of the coordination service (hosted by rank 0).
        master_port: Port of the coordination service; 0 only when
            ``world_size == 1`` (the OS picks one).
        host_id: Identifies this host; ranks with equal host ids share memory.
        token: Shared secret that authenticates every control and data
            connection; None only when ``world_size == 1``.
        source: Where the values came from, for error messages and logs.
        announced: Rank 0 tells the others the coordinator's address itself (``init(announce=)``,
            e.g. through torch.distributed's store), so its port may be 0 (the OS picks one).
        job_key: Set when every rank of a launcher's job runs on this host and nobody named a
            coordinator: rank 0 then publishes the coordinator's address (and a fresh token,
            unless one is configured) in a private file named by this key
            (``rendezvous/job_file.py``), so port and token may be unknown until then.
    """

    rank: int
    world_size: int
    local_rank: int | None
    local_size: int | None
    master_addr: str
    master_port: int
    host_id: str
    token: str | None
    source: str
    announced: bool = False
    job_key: str | None = None

    def __post_init__(self) -> None:
        where = f"(from {self.source})"
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size} {where}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside [0, world_size={self.world_size}) {where}; "
                "every process needs a distinct rank from 0 to world_size - 1"
            )
        if self.local_size is not None and self.local_size < 1:
            raise ValueError(f"local_size must be >= 1, got {self.local_size} {where}")
        if self.local_rank is not None and self.local_size is not None:
            if not 0 <= self.local_rank < self.local_size:
                raise ValueError(
                    f"local_rank {self.local_rank} is outside "
                    f"[0, local_size={self.local_size}) {where}"
                )
        if not self.master_addr:
            raise ValueError(f"the coordinator address (master_addr) is empty {where}")
        if not 0 <= self.master_port <= 65535:
            raise ValueError(f"master_port {self.master_port} is not a TCP port {where}")
        if (
            self.master_port == 0
            and self.world_size > 1
            and not (self.announced and self.rank == 0)
            and self.job_key is None
        ):
            raise ValueError(
                f"master_port is 0 but world_size is {self.world_size} {where}: the other "
                "ranks cannot find an OS-chosen port; give every rank the same port"
            )
        if self.token is None and self.world_size > 1 and self.job_key is None:
            raise ValueError(
                f"no cluster token for a group of {self.world_size} ranks {where}: {_TOKEN_HINT}"
            )
        if self.token is not None and not self.token:
            raise ValueError(f"the cluster token is empty {where}: {_TOKEN_HINT}")

    @property
    def master(self) -> str:
        """The coordinator address as ``host:port`` (IPv6 hosts in brackets)."""
        return format_address(self.master_addr, self.master_port)

    @property
    def master_is_loopback(self) -> bool:
        """Whether the coordinator is only reachable from this host."""
        return is_loopback(self.master_addr)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        master: str | None = None,
        token: str | None = None,
        announced: bool = False,
    ) -> ClusterSpec:
        """Builds the spec from explicit arguments and the launcher environment.

        Args:
            environ: Environment to read; ``os.environ`` when None.
            rank: Overrides the rank found in the environment.
            world_size: Overrides the world size found in the environment.
            master: Overrides the coordinator address, as ``"host:port"``.
            token: Overrides ``PYCOLLECTIVE_TOKEN``.
            announced: See the attribute: rank 0 publishes the coordinator's address itself.

        Returns:
            The spec. With no launcher environment and no arguments this is a
            single-process group (rank 0 of 1).

        Raises:
            ValueError: A variable is malformed or inconsistent, a TF_CONFIG
                task is not part of the collective group, the coordinator
                address is missing, or a multi-rank group has no token.
        """
        env = os.environ if environ is None else environ
        found = _detect(env)
        overridden = [
            name
            for name, value in (
                ("rank", rank),
                ("world_size", world_size),
                ("master", master),
                ("token", token),
            )
            if value is not None
        ]
        source = found.source
        if overridden:
            arguments = f"arguments ({', '.join(overridden)})"
            source = arguments if found.is_default else f"{arguments} + {source}"

        final_rank = found.rank if rank is None else _check_int_arg("rank", rank)
        final_world = (
            found.world_size if world_size is None else _check_int_arg("world_size", world_size)
        )
        if final_world is None or final_rank is None:
            missing = "rank" if final_rank is None else "world_size"
            raise ValueError(
                f"{missing} was not given and {found.source} does not provide it: pass both "
                "rank= and world_size=, or run under a launcher (pycollective run, "
                "TF_CONFIG, torchrun, mpirun, srun)"
            )

        final_token = token if token is not None else env.get("PYCOLLECTIVE_TOKEN") or None
        if final_token is None and final_world > 1:
            try:
                from_file = read_token_file(env)
            except ValueError as exc:
                raise ValueError(f"rank {final_rank} of {final_world} ({source}): {exc}") from None
            if from_file is not None:
                final_token = from_file[0]
                source = f"{source}; token from {from_file[1]}"

        job_key = None
        if (
            master is None
            and final_world > 1
            and (final_rank, final_world) == (found.rank, found.world_size)
            and _same_host_job(env, found)
        ):
            job_key = found.job_key
            master_addr, master_port = SAME_HOST_MASTER, 0
            source = (
                f"{source}; every rank on this host: rank 0 publishes the coordinator's "
                "address on loopback in a private file"
            )
        else:
            master_addr, master_port, master_note = _resolve_master(
                env, found, master, final_world, source
            )
            if master_note:
                source = f"{source}; {master_note}"

        # A rank or world size that differs from the launcher's makes the
        # launcher's local numbers meaningless: leave them unknown.
        local_rank, local_size = found.local_rank, found.local_size
        if (final_rank, final_world) != (found.rank, found.world_size):
            local_rank = local_size = None

        return cls(
            rank=final_rank,
            world_size=final_world,
            local_rank=local_rank,
            local_size=local_size,
            master_addr=master_addr,
            master_port=master_port,
            host_id=env.get("PYCOLLECTIVE_HOST_ID") or socket.gethostname(),
            token=final_token,
            source=source,
            announced=announced,
            job_key=job_key,
        )


@dataclass
class _Found:
    """What one launcher environment said; None means it did not say."""

    source: str
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # How master_port was obtained, when it was not read verbatim.
    master_note: str = ""
    # True when no launcher environment was found at all.
    is_default: bool = False
    # The launcher's id for this job (and step), unique among the jobs running on a host; None
    # when the launcher has none. Names the same-host launch file.
    job_key: str | None = None
    # The launcher says every rank of the job runs on this host.
    single_host: bool = False


def _detect(env: Mapping[str, str]) -> _Found:
    """Reads the first launcher environment present, in precedence order."""
    if "PYCOLLECTIVE_RANK" in env or "PYCOLLECTIVE_WORLD_SIZE" in env:
        return _from_pycollective(env)
    if env.get("TF_CONFIG", "").strip():
        return _from_tf_config(env["TF_CONFIG"])
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torchrun(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _from_open_mpi(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    return _Found(
        source="no launcher environment (single process)",
        rank=0,
        world_size=1,
        local_rank=0,
        local_size=1,
        is_default=True,
    )


def _from_pycollective(env: Mapping[str, str]) -> _Found:
    source = _PYCOLLECTIVE_SOURCE
    shape = "PYCOLLECTIVE_RANK=0 PYCOLLECTIVE_WORLD_SIZE=4"
    found = _Found(
        source=source,
        rank=_require_int(env, "PYCOLLECTIVE_RANK", source, shape),
        world_size=_require_int(env, "PYCOLLECTIVE_WORLD_SIZE", source, shape),
        local_rank=_optional_int(env, "PYCOLLECTIVE_LOCAL_RANK", source),
        local_size=_optional_int(env, "PYCOLLECTIVE_LOCAL_SIZE", source),
    )
    # PYCOLLECTIVE_MASTER_* are applied for every source in _resolve_master.
    return found


def _from_tf_config(raw: str) -> _Found:
    source = "TF_CONFIG"
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({exc}); expected e.g. TF_CONFIG='{_TF_CONFIG_EXAMPLE}'"
        ) from None
    if not isinstance(config, dict):
        raise _tf_error("is not a JSON object")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        raise _tf_error('has no "cluster" object')
    task = config.get("task")
    if not isinstance(task, dict):
        raise _tf_error('has no "task" object naming this process (type and index)')
    task_type = task.get("type")
    raw_index = task.get("index", 0)
    if not isinstance(task_type, str):
        raise _tf_error('has no string "task.type"')
    # TensorFlow itself accepts the index as a number or a digit string.
    if isinstance(raw_index, str) and raw_index.strip().isdigit():
        raw_index = int(raw_index)
    if not isinstance(raw_index, int) or isinstance(raw_index, bool) or raw_index < 0:
        raise _tf_error(f'"task.index" must be a non-negative integer, got {raw_index!r}')
    task_index: int = raw_index

    jobs: dict[str, list[str]] = {}
    for job in ("chief", "worker"):
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise _tf_error(f'"cluster.{job}" must be a list of "host:port" strings')
        jobs[job] = addresses
    if len(jobs["chief"]) > 1:
        raise _tf_error(f'"cluster.chief" has {len(jobs["chief"])} entries; at most one chief')

    if task_type in ("ps", "evaluator"):
        role = (
            "a parameter server (it serves variables to ParameterServerStrategy)"
            if task_type == "ps"
            else "an evaluator (it evaluates checkpoints on its own)"
        )
        raise ValueError(
            f'TF_CONFIG says this process is task "{task_type}" #{task_index}, {role}, which is '
            'not part of the collective group: only "chief" and "worker" tasks join it. Do not '
            "create a process group in this task."
        )
    if task_type not in jobs:
        raise _tf_error(
            f'"task.type" is "{task_type}"; expected "chief" or "worker" '
            '(or "ps"/"evaluator", which are not part of the collective group)'
        )
    if task_index >= len(jobs[task_type]):
        raise _tf_error(
            f'"task" is {task_type} #{task_index} but "cluster.{task_type}" lists '
            f"{len(jobs[task_type])} address(es)"
        )

    # Rank order: the chief first, then the workers in their listed order.
    members = [("chief", a) for a in jobs["chief"]] + [("worker", a) for a in jobs["worker"]]
    if not members:
        raise _tf_error('"cluster" lists no "chief" and no "worker" tasks')
    rank = task_index if task_type == "chief" else len(jobs["chief"]) + task_index

    hosts = []
    for job, address in members:
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise _tf_error(f'an address in "cluster.{job}" is malformed: {exc}') from None
        hosts.append((host, port))
    my_host = hosts[rank][0]
    same_host = [r for r, (host, _) in enumerate(hosts) if host == my_host]
    master_addr, master_port = hosts[0]
    return _Found(
        source=source,
        rank=rank,
        world_size=len(members),
        local_rank=same_host.index(rank),
        local_size=len(same_host),
        master_addr=master_addr,
        master_port=master_port,
    )


def _tf_error(problem: str) -> ValueError:
    return ValueError(f"TF_CONFIG {problem}; expected e.g. TF_CONFIG='{_TF_CONFIG_EXAMPLE}'")


def _from_launcher_vars(
    env: Mapping[str, str],
    source: str,
    shape: str,
    rank: str,
    size: str,
    local_rank: str,
    local_size: str,
) -> _Found:
    """Launchers that name rank, size and the local pair in four variables (torchrun, Open
    MPI); the master comes from MASTER_ADDR/MASTER_PORT or PYCOLLECTIVE_MASTER_*."""
    found = _Found(
        source=source,
        rank=_require_int(env, rank, source, shape),
        world_size=_require_int(env, size, source, shape),
        local_rank=_optional_int(env, local_rank, source),
        local_size=_optional_int(env, local_size, source),
    )
    _read_torch_master(env, found, source)
    return found


def _from_torchrun(env: Mapping[str, str]) -> _Found:
    return _from_launcher_vars(
        env,
        "torchrun environment (RANK, WORLD_SIZE, ...)",
        "RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=4 MASTER_ADDR=host MASTER_PORT=29500",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    )


def _from_open_mpi(env: Mapping[str, str]) -> _Found:
    found = _from_launcher_vars(
        env,
        "Open MPI environment (OMPI_COMM_WORLD_*)",
        "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 (set by mpirun)",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    )
    # The job's id: PMIx's namespace (Open MPI 4 and 5), else ORTE's job id (Open MPI 4).
    job = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid")
    found.job_key = f"ompi-{job}" if job else None
    found.single_host = found.local_size is not None and found.local_size == found.world_size
    return found


def _from_slurm(env: Mapping[str, str]) -> _Found:
    source = "Slurm environment (SLURM_*)"
    shape = "SLURM_PROCID=0 SLURM_NTASKS=4 (set by srun)"
    rank = _require_int(env, "SLURM_PROCID", source, shape)
    if "SLURM_NTASKS" in env:
        world_size = _require_int(env, "SLURM_NTASKS", source, shape)
    else:
        world_size = _require_int(env, "SLURM_NPROCS", source, shape)
    found = _Found(
        source=source,
        rank=rank,
        world_size=world_size,
        local_rank=_optional_int(env, "SLURM_LOCALID", source),
        local_size=_slurm_local_size(env, source),
    )
    _read_torch_master(env, found, source)
    # Rank 0 runs on the step's first node (srun places tasks in node list order).
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if found.master_addr is None and nodelist:
        found.master_addr = first_slurm_host(nodelist)
    # srun sets the step id; a batch script itself has none (and is no step of srun's).
    step_text = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    step_id = int(step_text) if step_text.isdigit() else 0
    if "SLURM_JOB_ID" in env:
        job_id = _require_int(env, "SLURM_JOB_ID", source, "SLURM_JOB_ID=12345")
        if step_text.isdigit():
            found.job_key = f"slurm-{job_id}.{step_id}"
        if found.master_port is None:
            found.master_port = slurm_port(job_id, step_id)
            found.master_note = (
                f"port {found.master_port} derived from SLURM_JOB_ID and SLURM_STEP_ID "
                "(set PYCOLLECTIVE_MASTER_PORT to choose another)"
            )
    nodes = _optional_int(env, "SLURM_STEP_NUM_NODES", source)
    if nodes is None:
        nodes = _optional_int(env, "SLURM_NNODES", source)
    found.single_host = nodes == 1
    return found


def slurm_port(job_id: int, step_id: int) -> int:
    """The coordinator port every rank of a Slurm job step derives on its own."""
    return (
        SLURM_PORT_BASE + (job_id % SLURM_PORT_JOBS) * SLURM_PORT_STEPS + step_id % SLURM_PORT_STEPS
    )


def _slurm_local_size(env: Mapping[str, str], source: str) -> int | None:
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else the step's (srun's) or the job's
    per-node layout, SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return _optional_int(env, "SLURM_NTASKS_PER_NODE", source)
    name = "SLURM_STEP_TASKS_PER_NODE"
    if not env.get(name):
        name = "SLURM_TASKS_PER_NODE"
    layout = env.get(name)
    if not layout:
        return None
    # Compressed per-node counts, e.g. "2(x3),1" = nodes 0-2 run 2 tasks, node 3 runs 1.
    counts: list[int] = []
    for part in layout.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(
                f'{name}={layout!r} is malformed (from {source}); expected e.g. "2(x3),1"'
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(set(counts)) == 1:
        return counts[0]
    node_id = _optional_int(env, "SLURM_NODEID", source)
    if node_id is None or node_id >= len(counts):
        return None
    return counts[node_id]


def _bare_host(addr: str) -> str:
    """An address as a host, without the brackets an IPv6 literal may come in ("[fd00::1]"):
    addresses are bracketed where a port is added (format_address)."""
    return addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr


def _read_torch_master(env: Mapping[str, str], found: _Found, source: str) -> None:
    """Reads MASTER_ADDR/MASTER_PORT, the torch.distributed convention."""
    if env.get("MASTER_ADDR"):
        found.master_addr = _bare_host(env["MASTER_ADDR"])
    torch_port = _optional_int(env, "MASTER_PORT", source)
    if torch_port is not None:
        found.master_port = torch_port + TORCH_MASTER_PORT_OFFSET
        found.master_note = (
            f"port MASTER_PORT+{TORCH_MASTER_PORT_OFFSET}={found.master_port}, because "
            "torch.distributed owns MASTER_PORT (set PYCOLLECTIVE_MASTER_PORT to choose another)"
        )


def _same_host_job(env: Mapping[str, str], found: _Found) -> bool:
    """Whether rank 0 should publish the coordinator through a private file on this host:
    every rank is here, the launcher names the job, and nobody named a coordinator."""
    named = ("PYCOLLECTIVE_MASTER_ADDR", "PYCOLLECTIVE_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT")
    return found.single_host and found.job_key is not None and not any(env.get(n) for n in named)


def _resolve_master(
    env: Mapping[str, str],
    found: _Found,
    master: str | None,
    world_size: int,
    source: str,
) -> tuple[str, int, str]:
    """Picks the coordinator address: argument, PYCOLLECTIVE_MASTER_*, the launcher.

    Returns:
        ``(addr, port, note)``; the note says where the address came from
        when that is not simply the launcher's environment, else "".
    """
    if master is not None:
        try:
            addr, port = parse_address(master)
        except ValueError as exc:
            raise ValueError(f"master={master!r} is malformed: {exc}") from None
        return addr, port, ""  # the source already names the master= argument

    addr, port, note = found.master_addr, found.master_port, found.master_note
    # PYCOLLECTIVE_* beats the launcher's own variables (DESIGN.md: arguments,
    # then PYCOLLECTIVE_* variables, then defaults).
    own_addr = env.get("PYCOLLECTIVE_MASTER_ADDR")
    own_port = _optional_int(env, "PYCOLLECTIVE_MASTER_PORT", "the environment")
    own = [
        name
        for name, value in (
            ("PYCOLLECTIVE_MASTER_ADDR", own_addr),
            ("PYCOLLECTIVE_MASTER_PORT", own_port),
        )
        if value not in (None, "")
    ]
    if own and found.source != _PYCOLLECTIVE_SOURCE:
        note = f"coordinator from {' and '.join(own)}"
    if own_addr:
        addr = _bare_host(own_addr)
    if own_port is not None:
        port = own_port

    if world_size == 1:
        # One process: nobody else needs to find the coordinator.
        return addr or "127.0.0.1", port or 0, note
    if not addr or port is None:
        missing = "address" if not addr else "port"
        raise ValueError(
            f"no coordinator {missing} for a group of {world_size} ranks (from {source}): set "
            "PYCOLLECTIVE_MASTER_ADDR and PYCOLLECTIVE_MASTER_PORT (or MASTER_ADDR/MASTER_PORT) "
            "to rank 0's host and a free port, the same on every rank, e.g. "
            "PYCOLLECTIVE_MASTER_ADDR=node1 PYCOLLECTIVE_MASTER_PORT=29400"
            + (
                " (mpirun across hosts: pass them with -x; on one host nothing is needed)"
                if found.source.startswith("Open MPI")
                else ""
            )
        )
    return addr, port, note


def _check_int_arg(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}= must be an int, got {value!r}")
    return value


def _require_int(env: Mapping[str, str], name: str, source: str, shape: str) -> int:
    value = _optional_int(env, name, source)
    if value is None:
        raise ValueError(f"{name} is not set (from {source}); expected e.g. {shape}")
    return value


def _optional_int(env: Mapping[str, str], name: str, source: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not an integer (from {source}); expected e.g. {name}=0"
        ) from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} is negative (from {source}); expected e.g. {name}=0")
    return value


def parse_address(address: str) -> tuple[str, int]:
    """Splits ``"host:port"`` (or ``"[v6addr]:port"``) into host and port.

    Args:
        address: The address text.

    Returns:
        ``(host, port)`` with IPv6 brackets removed.

    Raises:
        ValueError: The text is not ``host:port`` with a port in 0..65535.
    """
    host, sep, port_text = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f'{address!r} is not "host:port" (e.g. "node1:29400", "[::1]:29400")')
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """Joins host and port, bracketing IPv6 literals as gRPC expects."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list, e.g. ``"node[01-03],gpu7"`` -> ``"node01"``.

    Args:
        nodelist: ``SLURM_JOB_NODELIST`` in Slurm's compressed form.

    Returns:
        The first host name.

    Raises:
        ValueError: The list is empty or its brackets do not balance.
    """
    # The first entry ends at the first comma outside brackets.
    depth = 0
    end = len(nodelist)
    for i, char in enumerate(nodelist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end].strip()
    if not entry or depth < 0 or entry.count("[") != entry.count("]"):
        raise ValueError(
            f"SLURM_JOB_NODELIST={nodelist!r} is malformed; expected e.g. 'node[1-3],other'"
        )
    # Each bracket group ("[01-03,7]") contributes its first value ("01").
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], entry)
