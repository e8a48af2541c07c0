"""The NCCL loader: search order, and what NcclUnavailable says when nothing loads.

No GPU or NCCL needed: fake libraries are compiled here with the C compiler (one that is not
NCCL, one that is too old, one that looks like NCCL 2.21.5), and nonexistent paths stand in for
missing ones. The success path runs in a subprocess, because the process keeps the first NCCL
it loads for its whole life.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest

import pycollective as pc
from pycollective import nccl
from pycollective._ext import _C

ALL_SYMBOLS = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclGroupStart",
    "ncclGroupEnd",
]


def _compile(tmp_path, name: str, source: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake NCCL libraries")
    folder = tmp_path / name
    folder.mkdir()
    src = folder / "fake.c"
    src.write_text(textwrap.dedent(source))
    lib = folder / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(folder)


def _fake_nccl(version: int, symbols=ALL_SYMBOLS) -> str:
    lines = ["#include <string.h>"]
    for s in symbols:
        if s == "ncclGetVersion":
            lines.append(f"int ncclGetVersion(int* v) {{ *v = {version}; return 0; }}")
        elif s == "ncclGetUniqueId":
            lines.append(
                "int ncclGetUniqueId(char* id) { for (int i = 0; i < 128; ++i) "
                "id[i] = (char)(i * 3); return 0; }"
            )
        elif s in ("ncclGetErrorString", "ncclGetLastError"):
            lines.append(f'const char* {s}(void* x) {{ (void)x; return "fake"; }}')
        else:
            lines.append(f"int {s}(void) {{ return 0; }}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def no_env(monkeypatch):
    from pycollective import config

    monkeypatch.delenv("PYCOLLECTIVE_NCCL_LIBRARY", raising=False)
    config.reload()  # variables are read once; the native search below reads this snapshot
    yield
    monkeypatch.undo()
    config.reload()


@pytest.fixture
def fakes(tmp_path):
    return {
        "not_nccl": _compile(tmp_path, "not_nccl", "int some_other_library(void) { return 1; }\n"),
        "partial": _compile(tmp_path, "partial", _fake_nccl(22105, ALL_SYMBOLS[:3])),
        "old": _compile(tmp_path, "old", _fake_nccl(21003)),
        "good": _compile(tmp_path, "good", _fake_nccl(22105)),
    }


def _system_has_nccl() -> bool:
    try:
        nccl.probe([])
        return True
    except pc.NcclUnavailable:
        return False


def test_env_variable_is_the_only_candidate(monkeypatch, tmp_path):
    missing = str(tmp_path / "nowhere" / "libnccl.so.2")
    monkeypatch.setenv("PYCOLLECTIVE_NCCL_LIBRARY", missing)
    assert nccl.search_order() == [(missing, "PYCOLLECTIVE_NCCL_LIBRARY")]
    with pytest.raises(pc.NcclUnavailable) as info:
        nccl.probe([(str(tmp_path), "nvidia-nccl-cu12 wheel")])
    msg = str(info.value)
    assert missing in msg and "PYCOLLECTIVE_NCCL_LIBRARY" in msg
    assert "No such file" in msg or "cannot open" in msg  # dlerror's text
    # An explicit choice never falls back to the wheels or the system loader.
    assert "system loader" not in msg and "wheel" not in msg.split("Install it")[0]


def test_env_variable_may_name_a_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PYCOLLECTIVE_NCCL_LIBRARY", str(tmp_path))
    assert nccl.search_order() == [(str(tmp_path / "libnccl.so.2"), "PYCOLLECTIVE_NCCL_LIBRARY")]


def test_search_order_is_wheels_then_system(no_env, fakes, tmp_path):
    missing = str(tmp_path / "missing")
    dirs = [(missing, "nvidia-nccl-cu13 wheel"), (fakes["not_nccl"], "nvidia-nccl-cu12 wheel")]
    order = _C.nccl_search_order(dirs)
    assert [tuple(c) for c in order] == [
        (os.path.join(missing, "libnccl.so.2"), "nvidia-nccl-cu13 wheel"),
        (os.path.join(fakes["not_nccl"], "libnccl.so.2"), "nvidia-nccl-cu12 wheel"),
        ("libnccl.so.2", "system loader"),
    ]
    if _system_has_nccl():  # a GPU machine: the search goes past both failures to the system
        assert nccl.probe(dirs)["origin"] == "system loader"
        return
    with pytest.raises(pc.NcclUnavailable) as info:
        nccl.probe(dirs)
    msg = str(info.value)
    # Every candidate, in order, each with why it failed.
    at = [
        msg.index(os.path.join(missing, "libnccl.so.2")),
        msg.index(os.path.join(fakes["not_nccl"], "libnccl.so.2")),
        msg.index("libnccl.so.2 (system loader)"),
    ]
    assert at == sorted(at)
    assert "lacks ncclGetVersion" in msg  # the library that is not NCCL
    assert "pip install nvidia-nccl-cu12" in msg and "PYCOLLECTIVE_NCCL_LIBRARY" in msg


def test_missing_symbols_are_named(monkeypatch, fakes):
    monkeypatch.setenv("PYCOLLECTIVE_NCCL_LIBRARY", fakes["partial"])
    with pytest.raises(pc.NcclUnavailable) as info:
        nccl.probe([])
    msg = str(info.value)
    assert "ncclCommFinalize" in msg and "ncclAllReduce" in msg and "ncclGroupEnd" in msg
    assert "ncclGetVersion," not in msg  # the symbols it has are not listed as missing
    assert "reports NCCL 2.21.5" in msg


def test_too_old_version_is_refused(monkeypatch, fakes):
    monkeypatch.setenv("PYCOLLECTIVE_NCCL_LIBRARY", fakes["old"])
    with pytest.raises(pc.NcclUnavailable, match=r"NCCL 2\.10\.3, older than the minimum 2\.14"):
        nccl.probe([])


def test_a_working_library_loads(monkeypatch, fakes):
    monkeypatch.setenv("PYCOLLECTIVE_NCCL_LIBRARY", fakes["good"])
    info = nccl.probe([])
    assert info["version"] == "2.21.5" and info["version_code"] == 22105
    assert info["origin"] == "PYCOLLECTIVE_NCCL_LIBRARY"
    assert info["path"].endswith("libnccl.so.2")


def test_wheel_folder_is_used_when_it_works(no_env, fakes):
    info = nccl.probe(
        [(fakes["not_nccl"], "nvidia-nccl-cu13 wheel"), (fakes["good"], "nvidia-nccl-cu12 wheel")]
    )
    assert info["origin"] == "nvidia-nccl-cu12 wheel" and info["version"] == "2.21.5"


def test_process_library_and_unique_id_through_a_fake_nccl(fakes):
    """In a fresh process: the library is found lazily through the environment, kept, and
    get_unique_id() returns NCCL's 128 bytes; a communicator then needs a CUDA device."""
    code = textwrap.dedent("""
        import json, pycollective as pc
        out = {"before": pc._C.nccl_available()}
        info = pc.nccl.library_info()
        uid = pc.nccl.get_unique_id()
        want = bytes((i * 3) % 256 for i in range(128))
        out.update(version=info["version"], n=len(uid), ok=uid == want)
        try:
            pc.nccl.NcclCommunicator(1, uid, 0, device=0, timeout=5)
        except (pc.NcclUnavailable, ValueError, pc.CudaError, pc.NcclError) as e:
            out["comm"] = type(e).__name__
            out["message"] = str(e)
        print(json.dumps(out))
    """)
    env = dict(os.environ, PYCOLLECTIVE_NCCL_LIBRARY=fakes["good"])
    args = [sys.executable] + (["-S"] if sys.flags.no_site else []) + ["-c", code]
    done = subprocess.run(
        args,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(fakes["good"]),
    )
    assert done.returncode == 0, done.stderr
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["version"] == "2.21.5" and out["n"] == 128 and out["ok"]
    # Without a CUDA device (or without CUDA in the build) no communicator can exist; with one,
    # the fake's init "succeeds" without a communicator, which is refused by name.
    if _C.cuda_device_count() == 0:
        assert out["comm"] in ("NcclUnavailable", "ValueError")
    else:
        assert out["comm"] == "NcclError" and "no communicator" in out["message"], out


def test_unique_id_without_nccl_raises(tmp_path):
    """In a fresh process (this one may have loaded a real NCCL already)."""
    code = textwrap.dedent("""
        import pycollective as pc
        try:
            pc.nccl.get_unique_id()
        except pc.NcclUnavailable as e:
            print("NcclUnavailable", "absent.so" in str(e))
    """)
    env = dict(os.environ, PYCOLLECTIVE_NCCL_LIBRARY=str(tmp_path / "absent.so"))
    args = [sys.executable] + (["-S"] if sys.flags.no_site else []) + ["-c", code]
    done = subprocess.run(
        args, check=False, env=env, capture_output=True, text=True, timeout=60, cwd=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NcclUnavailable", "True"]


def test_errors_are_collective_errors_and_pickle():
    for cls in (pc.NcclUnavailable, pc.NcclError, pc.CudaError):
        assert issubclass(cls, pc.CollectiveError)
        e = pickle.loads(pickle.dumps(cls("tried: a, b")))
        assert type(e) is cls and str(e) == "tried: a, b"


def test_wheel_dirs_lists_only_existing_libraries():
    for folder, origin in nccl.wheel_dirs():
        assert os.path.exists(os.path.join(folder, "libnccl.so.2")), (folder, origin)
