"""Runs a test function on N processes at once, under a hard deadline.

    results = run_ranks(my_test_fn, 4, transport="tcp")

``my_test_fn(rank, world_size, *args)`` is a module-level function of a test module; every
rank imports that module by path and calls it in a fresh interpreter with the group's
environment set (as ``pycollective run`` would). Its return value (JSON) comes back per rank;
an exception comes back as a formatted traceback and fails the test. When the deadline passes,
every rank still running is killed and the failure lists them with their last output lines.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pycollective._spawn import in_own_process_group

HERE = os.path.dirname(os.path.abspath(__file__))


def reserve_ports(count: int = 1):
    """Ports the OS chose, held until the ``with`` block ends (pycollective/_ports.py): the
    processes started inside it listen on them; nobody else can take them meanwhile."""
    from pycollective._ports import PortReservation

    return PortReservation(count)


def expect_error(fn: Callable[[], Any]) -> list:
    """Runs fn inside a rank; returns [exception class name, message, seconds it took] (JSON, for
    the test to inspect), or ["no error", "", seconds]."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return [type(exc).__name__, str(exc), time.monotonic() - start]
    return ["no error", "", time.monotonic() - start]


class RankFailure(AssertionError):
    pass


def native_stacks(pid: int) -> str:
    """Every thread's native stack of a hung process (gdb, where installed): where it hangs."""
    import shutil

    if shutil.which("gdb") is None:
        return ""
    try:
        res = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    frames = [line for line in res.stdout.splitlines() if line.startswith(("Thread", "#"))]
    return "\n--- its threads (gdb)\n" + "\n".join(frames[-150:])


def processes_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose command line contains `text`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def run_ranks(
    fn: Callable[..., Any],
    n: int,
    *args: Any,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    per_rank_env: list[dict] | None = None,
    expect_exit: dict[int, int | None] | None = None,
) -> list[Any]:
    """Runs fn on n ranks; returns each rank's result. ``expect_exit`` maps ranks that are meant
    to die (exit code, or None for "killed by a signal / any") to skip their result."""
    with reserve_ports(1) as reserved:  # the coordinator's, until the ranks are gone
        return _run_ranks(fn, n, args, timeout, env, per_rank_env, expect_exit, reserved.ports[0])


def _run_ranks(fn, n, args, timeout, env, per_rank_env, expect_exit, port) -> list[Any]:
    # The ranks' folder goes with the call (a failure carries the logs it needs): the suite's
    # runs on one VM had left 3,735 of them in /tmp.
    with tempfile.TemporaryDirectory(prefix="pycol-ranks-", ignore_cleanup_errors=True) as tmp:
        return _run_ranks_in(tmp, fn, n, args, timeout, env, per_rank_env, expect_exit, port)


def _run_ranks_in(tmp, fn, n, args, timeout, env, per_rank_env, expect_exit, port) -> list[Any]:
    module_file = sys.modules[fn.__module__].__file__
    token = secrets.token_hex(8)
    procs, outs = [], []
    for r in range(n):
        e = dict(os.environ)
        e.update(
            {
                "PYCOLLECTIVE_RANK": str(r),
                "PYCOLLECTIVE_WORLD_SIZE": str(n),
                "PYCOLLECTIVE_MASTER_ADDR": "127.0.0.1",
                "PYCOLLECTIVE_MASTER_PORT": str(port),
                "PYCOLLECTIVE_TOKEN": token,
                # A hang becomes an error inside the rank well before the harness kills it.
                "PYCOLLECTIVE_TIMEOUT": str(max(2.0, timeout / 3)),
                "PYCOLLECTIVE_CONNECT_TIMEOUT": str(max(5.0, timeout / 3)),
            }
        )
        e.update(env or {})
        if per_rank_env:
            e.update(per_rank_env[r])
        out = open(os.path.join(tmp, f"rank{r}.log"), "w+")
        outs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    module_file,
                    fn.__name__,
                    os.path.join(tmp, f"rank{r}.json"),
                    json.dumps(list(args)),
                ],
                env=e,
                stdout=out,
                stderr=subprocess.STDOUT,
                **in_own_process_group(),
            )
        )
    expect_exit = expect_exit or {}
    deadline = time.monotonic() + timeout
    # Ranks meant to die (or freeze) may still be around once the others finished: they are
    # killed then, not waited for.
    while time.monotonic() < deadline and any(
        p.poll() is None for r, p in enumerate(procs) if r not in expect_exit
    ):
        time.sleep(0.02)
    hung = [r for r, p in enumerate(procs) if p.poll() is None and r not in expect_exit]
    stacks = {r: native_stacks(procs[r].pid) for r in hung}
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    logs = []
    for out in outs:
        out.seek(0)
        logs.append(out.read())
        out.close()
    if hung:
        tails = "\n".join(
            f"--- rank {r} (last lines)\n" + "\n".join(logs[r].splitlines()[-15:]) + stacks[r]
            for r in hung
        )
        raise RankFailure(f"ranks {hung} still running after {timeout} s; killed.\n{tails}")
    results = []
    for r, p in enumerate(procs):
        if r in expect_exit:
            want = expect_exit[r]
            if want is not None and p.returncode != want:
                raise RankFailure(f"rank {r} exited {p.returncode}, expected {want}:\n{logs[r]}")
            results.append(None)
            continue
        path = os.path.join(tmp, f"rank{r}.json")
        if p.returncode != 0 or not os.path.exists(path):
            raise RankFailure(f"rank {r} failed (exit {p.returncode}):\n{logs[r][-4000:]}")
        with open(path) as f:
            results.append(json.load(f))
    return results


def _child(module_file: str, fn_name: str, result_path: str, args_json: str) -> None:
    import importlib.util

    sys.path.insert(0, os.path.dirname(module_file))
    spec = importlib.util.spec_from_file_location("rank_test_module", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank = int(os.environ["PYCOLLECTIVE_RANK"])
    n = int(os.environ["PYCOLLECTIVE_WORLD_SIZE"])
    result = getattr(module, fn_name)(rank, n, *json.loads(args_json))
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _child(*sys.argv[1:5])
