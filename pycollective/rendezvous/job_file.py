"""Same-host launches with no setup: the ranks of one job share the coordinator's address and
a fresh token through a file only this user can read.

srun and mpirun give every rank its rank and the world size, but neither a secret nor (mpirun)
an address. When all ranks of a job run on this host, rank 0 starts the coordinator on loopback
with a port the OS picks, and writes ``{address, token, pid}`` to
``$TMPDIR/pycollective-<uid>/job-<launcher job id>.json``: mode 0600 in a 0700 folder owned by
this user, so another user can neither read the token nor plant a file. The other ranks wait for
the file (up to the connect timeout), read it, and connect. Rank 0 deletes the file once every
rank has registered. A file left by a crashed job whose id comes round again is recognised by
its writer's process id, which is no longer alive, and is ignored.

The token still authenticates every control and data connection, exactly as one set by hand.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass, replace

from .client import RendezvousError
from .cluster import ClusterSpec, format_address, parse_address

_POLL_SECONDS = 0.02


def job_folder() -> str:
    """This user's private folder for job files (created 0700 when missing)."""
    folder = os.path.join(tempfile.gettempdir(), f"pycollective-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or mode & 0o077:
        raise RendezvousError(
            f"{folder} holds the same-host launch files and must be a folder of this user "
            f"(uid {os.getuid()}) that nobody else can enter, but it is "
            f"{'a folder' if stat.S_ISDIR(info.st_mode) else 'not a folder'} of uid "
            f"{info.st_uid} with mode {mode:04o}: remove it, or set TMPDIR to another place"
        )
    return folder


def job_file_path(job_key: str) -> str:
    """The file a job's rank 0 publishes in; the launcher's job id names it."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_key)
    return os.path.join(job_folder(), f"job-{safe}.json")


@dataclass
class SameHostJob:
    """One rank's side of the exchange: rank 0 publishes, the others wait and read."""

    spec: ClusterSpec
    path: str

    @classmethod
    def join(cls, spec: ClusterSpec, timeout: float) -> SameHostJob:
        """Rank 0: fills in a token (a fresh one unless configured) and keeps the port 0 for
        the OS to pick; other ranks: wait for rank 0's file and take its address and token.

        Raises:
            RendezvousError: The folder is not private, or rank 0's file did not appear within
                ``timeout`` seconds.
        """
        assert spec.job_key is not None
        path = job_file_path(spec.job_key)
        if spec.rank == 0:
            token = spec.token or secrets.token_hex(16)
            return cls(replace(spec, token=token, announced=True), path)
        published = _wait_for(path, spec, timeout)
        host, port = parse_address(published["address"])
        return cls(
            replace(spec, master_addr=host, master_port=port, token=published["token"]), path
        )

    def publish(self, address: str) -> None:
        """Rank 0, once its coordinator listens: writes address and token, 0600, atomically."""
        host, port = parse_address(address)
        content = {
            "address": format_address(host, port),
            "token": self.spec.token,
            "pid": os.getpid(),
        }
        temporary = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(content, f)
        os.replace(temporary, self.path)

    def finish(self) -> None:
        """Rank 0, once every rank registered (or init failed): the file has done its job."""
        if self.spec.rank != 0:
            return
        try:
            with open(self.path) as f:
                mine = json.load(f).get("pid") == os.getpid()
        except (OSError, ValueError):
            return
        if mine:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _wait_for(path: str, spec: ClusterSpec, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        published = _read_current(path)
        if published is not None:
            return published
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"rank {spec.rank} of {spec.world_size}: rank 0 did not publish the "
                f"coordinator's address in {path} within {timeout:.0f} s (every rank of this "
                f"job is on this host, launched by {spec.source}). Is rank 0 running? Its "
                "output says why it stopped; PYCOLLECTIVE_CONNECT_TIMEOUT waits longer"
            )
        time.sleep(_POLL_SECONDS)


def _read_current(path: str) -> dict | None:
    """The file's content when it is complete, private and written by a live process."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        try:
            content = json.load(f)
        except ValueError:
            return None
    if not isinstance(content, dict) or not all(
        isinstance(content.get(k), t) for k, t in (("address", str), ("token", str), ("pid", int))
    ):
        return None
    return content if pid_alive(content["pid"]) else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
