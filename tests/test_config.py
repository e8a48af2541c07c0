"""The PYCOLLECTIVE_* variables: one table (csrc/core/knobs.h) for both sides, read through one
accessor per side (pycollective/config.py, core/knobs.cc), never by hand elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pycollective import config

ROOT = Path(__file__).resolve().parents[1]
# Sources that read variables: the package, the strategies, the benchmarks, the native core.
PYTHON = [p for d in ("pycollective", "strategies", "bench") for p in (ROOT / d).rglob("*.py")]
NATIVE = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in {".cc", ".h", ".cu"}]
# A variable name (not part of an identifier, nor a "PYCOLLECTIVE_MASTER_*" family).
_NAME = re.compile(r"(?<![A-Za-z0-9_])PYCOLLECTIVE_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_]*\*)")
_STRING = re.compile(r'"([^"\n]*)"')
# Build-time names that are not environment variables: C macros from config.h and CMake.
_NOT_VARIABLES = {
    "PYCOLLECTIVE_HAVE_CUDA",
    "PYCOLLECTIVE_VERSION",
    "PYCOLLECTIVE_COMPILER",
    "PYCOLLECTIVE_CXX_FLAGS",
    "PYCOLLECTIVE_BUILD_TYPE",
    "PYCOLLECTIVE_CUDA_VERSION",
    "PYCOLLECTIVE_CUDA_ARCHITECTURES",
    "PYCOLLECTIVE_X86_KERNELS",
}

pytestmark = pytest.mark.skipif(
    not (ROOT / "csrc" / "core" / "knobs.h").exists(), reason="needs the source tree"
)


def _named(path: Path) -> set[str]:
    text = path.read_text()
    if path.suffix == ".py":
        return set(_NAME.findall(text))
    return {n for s in _STRING.findall(text) for n in _NAME.findall(s)}


def test_every_variable_the_code_names_is_in_the_table():
    declared = {k.name for k in config.KNOBS}
    missing = {}
    for path in PYTHON + NATIVE:
        for name in _named(path) - declared - _NOT_VARIABLES:
            if "_pb2" not in path.name:
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"declare these in csrc/core/knobs.h: {missing}"


def test_nothing_reads_the_environment_but_the_accessors():
    by_hand_py = re.compile(r"environ(?:\.get)?\s*[\(\[]\s*[\"']PYCOLLECTIVE_")
    offenders = [
        str(p.relative_to(ROOT))
        for p in PYTHON
        if p.name != "config.py" and by_hand_py.search(p.read_text())
    ]
    offenders += [
        str(p.relative_to(ROOT))
        for p in NATIVE
        if p.name != "knobs.cc" and "getenv(" in p.read_text()
    ]
    assert not offenders, f"read PYCOLLECTIVE_* through config.get / knobs:: instead: {offenders}"


def test_table_is_complete_and_typed():
    assert len({k.name for k in config.KNOBS}) == len(config.KNOBS)
    for k in config.KNOBS:
        assert k.name.startswith("PYCOLLECTIVE_") and k.type in ("int", "float", "str"), k
        assert k.doc, k
        if k.default and k.type != "str":
            float(k.default)  # a numeric default parses


def test_values_are_read_once_and_reloaded_on_request(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_HEARTBEAT_TIMEOUT", "7.5")
    assert config.get("PYCOLLECTIVE_HEARTBEAT_TIMEOUT") == 6.0  # the snapshot, not the env
    config.reload()
    assert config.get("PYCOLLECTIVE_HEARTBEAT_TIMEOUT") == 7.5
    monkeypatch.setenv("PYCOLLECTIVE_SHM_RING_BYTES", "lots")
    config.reload()
    with pytest.raises(ValueError, match="PYCOLLECTIVE_SHM_RING_BYTES='lots' is not an integer"):
        config.get("PYCOLLECTIVE_SHM_RING_BYTES")
    monkeypatch.undo()
    config.reload()


def test_undeclared_names_are_refused_and_typos_reported(monkeypatch):
    with pytest.raises(KeyError, match="declare it there first"):
        config.get("PYCOLLECTIVE_NO_SUCH_THING")
    monkeypatch.setenv("PYCOLLECTIVE_TIMOUT", "5")
    assert "PYCOLLECTIVE_TIMOUT" in config.unknown_variables()


def test_native_side_reads_the_same_table(monkeypatch):
    """The native segment size follows the snapshot: a bad value set after the last reload is
    not seen until the next one, then refused by name."""
    import numpy as np

    import pycollective as pc

    comm = pc.LocalCommunicator(2)
    monkeypatch.setenv("PYCOLLECTIVE_SEGMENT_BYTES", "-5")
    xs = [np.ones(1000, np.float32) for _ in range(2)]
    assert comm.allreduce(xs, algo="ring")[0][0] == 2.0  # still the snapshot's value
    config.reload()
    with pytest.raises(Exception, match="PYCOLLECTIVE_SEGMENT_BYTES must be positive"):
        comm.allreduce(xs, algo="ring")
    monkeypatch.undo()
    config.reload()


def test_docs_page_is_the_table():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert config.markdown_table() in page, (
        "docs/configuration.md is out of date: paste pycollective.config.markdown_table() in"
    )
