"""Logging in the spirit of NCCL_DEBUG / NCCL_DEBUG_SUBSYS: levels and subsystems, one format
with the rank on the native and the Python side, and auto's choice said once per size class."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CLI = os.path.join(os.path.dirname(sys.executable), "pycollective")
PROGRAM = """
import logging, numpy as np, pycollective as pc
pc.init()
for _ in range(5):
    pc.allreduce(np.ones(1000, np.float32))          # one size class, five calls
pc.allreduce(np.ones(100000, np.float32))            # another size class
logging.getLogger("pycollective.strategies.parameter_server").info("from python")
pc.shutdown()
"""
_LINE = re.compile(r"^\[rank (\d)\] pycollective\[rank (\d) [^\]]+:\d+\] (\w+) (\w+): (.*)$")


def _run(tmp_path, **env) -> list[tuple[int, str, str, str]]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    res = subprocess.run(
        [CLI, "run", "-n", "2", "--timeout", "60", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=80,
        cwd=tmp_path,
        env=dict(os.environ, **env),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = []
    for line in (res.stdout + res.stderr).splitlines():
        m = _LINE.match(line)
        if m:
            assert m.group(1) == m.group(2), line  # the prefix names the rank that wrote it
            lines.append((int(m.group(2)), m.group(3), m.group(4), m.group(5)))
    return lines


@pytest.mark.timeout(120)
def test_one_format_both_sides_and_auto_said_once_per_size_class(tmp_path):
    lines = _run(tmp_path, PYCOLLECTIVE_DEBUG="INFO")
    subsystems = {s for _, _, s, _ in lines}
    assert {"INIT", "TRANSPORT", "COLL", "PS"} <= subsystems, lines
    for rank in (0, 1):
        chose = [m for r, _, s, m in lines if r == rank and s == "COLL" and "auto chose" in m]
        assert len(chose) == 2, chose  # two size classes, not six calls
        assert any(m == "from python" for r, lvl, s, m in lines if r == rank and s == "PS")


@pytest.mark.timeout(120)
def test_subsystems_narrow_info_lines(tmp_path):
    only_coll = _run(tmp_path, PYCOLLECTIVE_DEBUG="INFO", PYCOLLECTIVE_DEBUG_SUBSYS="COLL")
    assert only_coll and {s for _, _, s, _ in only_coll} == {"COLL"}, only_coll
    all_but = _run(tmp_path, PYCOLLECTIVE_DEBUG="INFO", PYCOLLECTIVE_DEBUG_SUBSYS="^COLL,PS")
    found = {s for _, _, s, _ in all_but}
    assert "COLL" not in found and "PS" not in found and "INIT" in found, all_but


@pytest.mark.timeout(120)
def test_default_level_is_quiet(tmp_path):
    assert _run(tmp_path) == []
