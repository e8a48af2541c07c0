"""A program for ``pycollective run -n MIN:MAX``: groups that lose a process, then re-form.

    pycollective run -n 3 --max-restarts 3 python tests/elastic_churn.py OUTDIR 2,0,1

Each group agrees (rank 0 broadcasts it) how many processes were killed so far, g. While g is
below the number of victims listed, the group's rank ``victims[g]`` notes the time and SIGKILLs
itself at once, while the others wait in an all-reduce: they get the failure, call
``pycollective.reinit()``, and the group re-forms with the survivors and any replacement the
launcher started. After the last kill, every process checks one more all-reduce and exits 0.

Each process writes OUTDIR/pid-<pid>.json: per group it was in, its rank, the world size, its
thread, coordinator-pool thread and file-descriptor counts after joining, and (as a survivor) the seconds from the kill to
its error, the error's text, and the seconds from the kill to the re-formed group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import pycollective as pc


def counts() -> tuple[int, int, int]:
    """Python threads (but the coordinator's gRPC pool, which starts workers lazily as calls
    overlap, up to its bound), the pool's workers, and open file descriptors."""
    names = [t.name for t in threading.enumerate()]
    pool = sum(1 for n in names if n.startswith("pc-coord_"))
    return len(names) - pool, pool, len(os.listdir("/proc/self/fd"))


def main() -> None:
    outdir, victims = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
    log: dict = {"pid": os.getpid(), "groups": []}
    path = os.path.join(outdir, f"pid-{os.getpid()}.json")

    def save() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(log, f)
        os.replace(path + ".tmp", path)

    group = pc.init(timeout=30.0)
    while True:
        threads, pool, fds = counts()
        entry = {"rank": group.rank, "size": group.size, "threads": threads, "fds": fds}
        entry["pool"] = pool
        log["groups"].append(entry)
        save()
        killed = pc.broadcast(np.array([_kills(outdir)]), root=0)
        g = int(killed[0])
        x = np.arange(1000, dtype=np.float64) + group.rank
        expected = group.size * np.arange(1000) + sum(range(group.size))
        if g >= len(victims):
            np.testing.assert_array_equal(pc.allreduce(x), expected)
            break
        try:
            # The victim dies right after this call; a survivor still finishing it (its own
            # last reduction) is aborted with the group, which is fine: it re-forms next.
            result = pc.allreduce(x)
            np.testing.assert_array_equal(result, expected)
            entry["checked"] = True
            if group.rank == victims[g] % group.size:
                with open(os.path.join(outdir, f"kill-{g}"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # the victim is gone: this fails
                pc.allreduce(x)
        except pc.CollectiveError as exc:
            failed = time.time()
            entry["error"] = str(exc)
        killed_at = _kill_time(outdir, g)
        entry["detect_s"] = failed - killed_at
        group = pc.reinit(min_size=2)
        entry["reformed_s"] = time.time() - killed_at
        save()
    pc.shutdown()
    log["done"] = True
    save()


def _kills(outdir: str) -> int:
    return sum(1 for name in os.listdir(outdir) if name.startswith("kill-"))


def _kill_time(outdir: str, g: int) -> float:
    path = os.path.join(outdir, f"kill-{g}")
    for _ in range(500):
        try:
            with open(path) as f:
                return float(f.read())
        except (FileNotFoundError, ValueError):
            time.sleep(0.01)
    raise RuntimeError(f"{path} never appeared")


if __name__ == "__main__":
    main()
