"""Finds the ps and worker tasks that ``pycollective run --ps N --workers M`` started, from the
chief (their sibling): by the TF_CONFIG in /proc (Linux). Tests use it to kill a task."""

from __future__ import annotations

import json
import os


def task_pid(job: str, index: int) -> int | None:
    """The pid of the live task ``job`` ``index`` that this process's parent (the launcher)
    started, or None (not started yet, or exited: a zombie shows no environment)."""
    launcher = os.getppid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher:
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for item in environ:
            if item.startswith(b"TF_CONFIG="):
                task = json.loads(item[len(b"TF_CONFIG=") :]).get("task")
                if task == {"type": job, "index": index}:
                    return int(name)
    return None
