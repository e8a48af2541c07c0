"""The coordination service's host (rank 0) dies: every other rank errors within 10 s, and the
error names it -- whether the survivors are inside a collective, idle between calls, or waiting
on the coordinator itself (a barrier through the service). Plain launches, no elastic launcher:
re-forming the group around a new coordinator is tested in test_elastic.py."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import numpy as np
import pytest
from multiproc import run_ranks


def _rank_0_dies(rank, n, where, stamp_dir):
    import pycollective as pc
    from pycollective.process_group import _default

    pc.init(timeout=30)
    pc.barrier()
    if rank == 0:
        time.sleep(0.5)
        with open(os.path.join(stamp_dir, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if where == "idle":
        time.sleep(2.0)  # the death happens between two calls
    try:
        if where == "service":
            _default()._world.client.barrier("test/after", timeout=30)
        else:
            pc.allreduce(np.ones(1 << 18, np.float32), algo="ring")
            pc.allreduce(np.ones(1 << 18, np.float32), algo="ring")
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        failed = time.time()
        with open(os.path.join(stamp_dir, "killed")) as f:
            killed = float(f.read())
        return [type(exc).__name__, str(exc), failed - killed]
    return ["no error", "", 0.0]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("where", ["collective", "idle", "service"])
@pytest.mark.parametrize("transport", ["tcp", "shm", "grpc"])
def test_rank_0_death_is_reported_within_10_s_naming_it(transport, where):
    with tempfile.TemporaryDirectory() as stamps:
        res = run_ranks(
            _rank_0_dies,
            3,
            where,
            stamps,
            timeout=60,
            env={"PYCOLLECTIVE_TRANSPORT": transport},
            expect_exit={0: None},
        )
    for r in (1, 2):
        name, msg, seconds = res[r]
        assert name in ("RemoteError", "Aborted", "RendezvousError"), res[r]
        assert "rank 0" in msg, msg
        assert seconds < 10.0, f"rank {r} took {seconds:.1f} s to notice: {msg}"
