"""``pycollective run -n MIN:MAX [--max-restarts N]``: an elastic job on this machine.

The launcher starts MAX processes and the elastic rendezvous store
(pycollective/rendezvous/elastic.py) in a process of its own that lives as long as the launcher,
so the store outlives any rank -- rank 0 included -- and the processes find every new group's
coordinator through it. When a process dies, the others are
not stopped: they get the failure from their collective, and ``pycollective.reinit()`` (or
``shutdown()`` then ``init()``) forms a new group with whoever is alive. While restarts are left,
the launcher starts a replacement for each process that failed, and the replacement joins the
re-formed group. The job fails when fewer than MIN processes are left alive and no restart is
left, and succeeds when every remaining process exits 0.
"""

from __future__ import annotations

import os
import secrets
import select
import subprocess
import threading
import time
from collections.abc import Sequence

from pycollective._spawn import child_environment, python_module_command
from pycollective.launcher import (
    _describe_exit,
    _die_with_parent,
    _RankGroup,
    _say,
    _stop_on_signal,
    _stop_on_timeout,
    _supervision,
)
from pycollective.rendezvous.elastic import ENV_STORE

STORE_MODULE = "pycollective.elastic_store"

_POLL_S = 0.05
#: how long the rendezvous store may take to start and print its address
_STORE_START_S = 30.0


def launch_elastic(
    command: Sequence[str],
    min_size: int,
    max_size: int,
    *,
    max_restarts: int = 0,
    last_call: float = 30.0,
    timeout: float | None = None,
    tag_output: bool = True,
    grace: float = 5.0,
) -> int:
    """Starts ``max_size`` processes of ``command`` as one elastic job and supervises them.

    Returns:
        0 when every process still in the job exited 0; the exit code of the failure that left
        fewer than ``min_size`` processes (128+N for signal N); 124 on timeout; 128+N when the
        launcher itself received signal N.
    """
    group = _RankGroup(tag_output=tag_output, grace=grace)
    base = child_environment(None)
    token = base.get("PYCOLLECTIVE_TOKEN") or secrets.token_hex(16)
    with (
        _StoreProcess(token, min_size, max_size, last_call) as store,
        _supervision(group) as received,
    ):
        env = dict(base)
        # No RANK/WORLD_SIZE/TF_CONFIG: rank and world size come from the rendezvous, round by
        # round; a fixed environment would be wrong after the first failure.
        env.update(PYCOLLECTIVE_TOKEN=token, **{ENV_STORE: store.address})
        if tag_output:
            env.setdefault("PYTHONUNBUFFERED", "1")
        _say(
            f"elastic job: {max_size} processes, at least {min_size}, up to {max_restarts} "
            f"replacement(s); rendezvous on {store.address}"
        )
        try:
            for slot in range(max_size):
                group.start(slot, command, env, label=f"proc {slot}")
        except OSError as exc:
            _say(f"cannot start {command[0]!r}: {exc}")
            group.stop_all()
            return 127
        return _supervise(group, received, store, command, env, min_size, max_restarts, timeout)


class _StoreProcess:
    """The rendezvous store (pycollective/rendezvous/elastic.py) in a process of its own: this
    process forks the ranks, which must not happen while gRPC runs threads here. It learns the
    live process count from the launcher through its stdin and dies with the launcher."""

    def __init__(self, token: str, min_size: int, max_size: int, last_call: float) -> None:
        env = child_environment(None)
        env["PYCOLLECTIVE_TOKEN"] = token
        self._process = subprocess.Popen(
            python_module_command(STORE_MODULE, str(min_size), str(max_size), str(last_call)),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        assert self._process.stdout is not None
        # Bounded: a store that never says where it listens must not hang the launcher.
        ready, _, _ = select.select([self._process.stdout], [], [], _STORE_START_S)
        first = self._process.stdout.readline().split() if ready else []
        if len(first) != 2 or first[0] != "address":
            self._process.kill()
            raise RuntimeError(
                f"the elastic rendezvous store did not say where it listens within "
                f"{_STORE_START_S:g} s (exit code {self._process.wait()})"
            )
        self.address = first[1]
        self.rounds = 0
        self._live: int | None = None
        self._reader = threading.Thread(target=self._read, name="pc-store-out", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("round "):
                self.rounds += 1

    def set_live(self, count: int) -> None:
        """Tells the store how many processes of the job are alive (when it changed)."""
        if count != self._live and self._process.stdin is not None:
            self._live = count
            try:
                self._process.stdin.write(f"{count}\n")
                self._process.stdin.flush()
            except OSError:
                pass

    def alive(self) -> bool:
        return self._process.poll() is None

    def __enter__(self) -> _StoreProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()  # the store's signal to stop
            except OSError:
                pass
        try:
            self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=1.0)


def _supervise(
    group: _RankGroup,
    received: list[int],
    store: _StoreProcess,
    command: Sequence[str],
    env: dict[str, str],
    min_size: int,
    max_restarts: int,
    timeout: float | None,
) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    handled = 0  # exits reacted to so far (poll() lists them in order)
    restarts = 0
    while True:
        stopped = _stop_on_signal(group, received, "processes")
        if stopped is not None:
            return stopped
        exited = group.poll()
        for entry in exited[handled:]:
            handled += 1
            code = entry.returncode
            assert code is not None
            if code == 0:
                continue
            what, exit_code = _describe_exit(code)
            alive = sum(1 for e in group.ranks if e.returncode is None)
            if restarts < max_restarts:
                restarts += 1
                slot = len(group.ranks)
                try:
                    group.start(slot, command, env, label=f"proc {slot}")
                except OSError as exc:
                    _say(f"cannot start a replacement: {exc}")
                else:
                    _say(
                        f"proc {entry.rank} (pid {entry.process.pid}) {what}; started proc "
                        f"{slot} to replace it (restart {restarts} of {max_restarts}); the "
                        "others re-form the group with it"
                    )
                    continue
            if alive >= min_size:
                _say(
                    f"proc {entry.rank} (pid {entry.process.pid}) {what}; {alive} process(es) "
                    f"left (minimum {min_size}) re-form the group without it"
                )
                continue
            group.stop_all(interrupts=received)
            _say(
                f"proc {entry.rank} (pid {entry.process.pid}) {what}; only {alive} process(es) "
                f"left, fewer than the minimum {min_size}, and no restart left: stopped the job"
            )
            return exit_code
        store.set_live(sum(1 for e in group.ranks if e.returncode is None))
        if group.all_exited():
            _say(f"all processes exited; {store.rounds} group(s) formed, {restarts} restart(s)")
            return 0
        if not store.alive():
            group.stop_all(interrupts=received)
            _say("the rendezvous store exited; stopped the job (no group could re-form)")
            return 1
        stopped = _stop_on_timeout(group, received, deadline, timeout, "processes")
        if stopped is not None:
            return stopped
        time.sleep(_POLL_S)
