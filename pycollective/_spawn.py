"""How pycollective starts Python processes of its own (benchmark ranks, parameter-server
tasks) and the environment of every process it starts (launcher ranks too), so that each one
imports the package its parent runs, whatever its current directory holds.

Python puts the current directory first on ``sys.path`` for ``python -c`` and ``python -m``; from
the root of a source checkout that is the unbuilt ``pycollective/`` folder. Two defences:

- :func:`python_module_command` starts our own modules with that entry removed, so no folder in
  the current directory can shadow the installed package;
- :func:`child_environment` names the parent's package folder, so that a user's program started
  by ``pycollective run`` from the checkout's root is redirected to it by the source folder's
  import guard (``pycollective/_ext.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pycollective._ext import PACKAGE_DIR_VARIABLE

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# `python -c` sees sys.argv == ["-c", module, *args]: drop the current directory from the path,
# then run the module as `python -m` would, with its own arguments.
_RUN_MODULE = (
    "import runpy, sys; del sys.path[0]; sys.argv[:2] = [sys.argv[1]]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (``os.environ`` when None) plus the folder of the package this process runs."""
    env = dict(os.environ if base is None else base)
    env[PACKAGE_DIR_VARIABLE] = _PACKAGE_DIR
    return env


def python_module_command(module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args...`` with this interpreter, except that the
    current directory is not put on ``sys.path``."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def own_process_group(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` that puts the child in a process group of its own, in this session, then
    runs ``then`` (another preexec step, or None).

    The group lets a launcher signal a rank and whatever the rank started (``os.killpg``). Not a
    session of its own (``start_new_session=True``): on kernels with autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in most distributions' kernels)
    each session is scheduled as one unit, fairly against the others, and ``sched_yield()`` only
    hands the core to threads of the same unit. A rank that waits for a peer yields so that the
    peer can run; with every rank in a session of its own that hand-off never happens, and where
    ranks outnumber cores each wait lasts until the scheduler's tick. Measured on 2 cores: a
    4-rank 8-byte all-reduce took 0.4-2 ms instead of 15-60 us, and Open MPI's own ranks,
    started under ``setsid``, slowed down alike (docs/benchmarks-log.md, "Ranks in one session").
    """

    def preexec() -> None:
        os.setpgid(0, 0)
        if then is not None:
            then()

    return preexec


def in_own_process_group() -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that start the child as :func:`own_process_group`
    does, without running Python code between fork and exec where the interpreter allows it.

    With ``process_group=0`` (Python 3.11 and later) CPython starts the child with vfork, which
    runs none of the process's fork handlers. gRPC installs some: a parent with live gRPC
    channels or servers that forked its children instead started ranks that aborted at once
    ("epoll_wait error: Bad file descriptor" in gRPC's poller). Measured: the test suite's
    coordinator-loss tests, run after its in-process rendezvous tests, failed that way in 3
    runs of 3, in none of 3 with this (nor with GRPC_ENABLE_FORK_SUPPORT=0, in 2 of 2). Python
    3.10 has only the preexec function."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": own_process_group()}
