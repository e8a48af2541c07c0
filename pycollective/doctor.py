"""``pycollective doctor``: what a user pastes into a bug report, the way
``python -m torch.utils.collect_env`` does: version and commit, build options, the optional
libraries found and from where, the transports this host offers, the tuning table in use, and
every ``PYCOLLECTIVE_*`` variable set.

Each probe catches its own failure and reports it as text: the doctor must run, and say what is
wrong, exactly where something is broken.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable

from pycollective import config

HELP = "print the build, libraries, transports and settings found (for bug reports)"

# Values of these variables are secrets: shown as set, never printed.
_OPTIONAL_PACKAGES = (
    "numpy",
    "grpcio",
    "protobuf",
    "ml_dtypes",
    "torch",
    "jax",
    "jaxlib",
    "cupy-cuda12x",
    "cupy-cuda13x",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "mpi4py",
    "cloudpickle",
)


def version_line() -> str:
    """``pycollective 0.1.0 (commit abc123, CUDA 13.0 / CPU-only)`` for ``--version``."""
    import pycollective

    info = pycollective.build_info()
    cuda = f"CUDA {info['cuda_version']}" if info.get("cuda") else "CPU-only"
    return f"pycollective {info['version']} (commit {commit()}, {cuda})"


def commit() -> str:
    """The git commit the installed build came from, as recorded by CMake at build time."""
    try:
        from pycollective._commit import COMMIT
    except ImportError:
        return "unknown"
    return COMMIT


def _guard(probe: Callable[[], object]) -> object:
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - a failed probe is a finding, not a crash
        return f"error: {type(exc).__name__}: {exc}"


def _build() -> dict:
    import pycollective

    info = pycollective.build_info()
    info["commit"] = commit()
    info["package"] = os.path.dirname(pycollective.__file__)
    info["algorithms"] = pycollective.algorithms()
    return info


def _package(name: str) -> str:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    return f"{dist.version} ({dist.locate_file('')})"


def _nccl() -> str:
    from pycollective import nccl
    from pycollective.errors import NcclUnavailable

    try:
        found = nccl.probe()
    except NcclUnavailable:
        tried = ", ".join(f"{path} ({origin})" for path, origin in nccl.search_order())
        return f"not found (tried: {tried})"
    return f"{found['version']} from {found['path']} ({found['origin']})"


def _cuda_devices() -> str:
    from pycollective._ext import _C

    if not _C.build_info()["cuda"]:
        return "not compiled in"
    return _C.cuda_describe()


def _master_addr() -> str:
    """The coordinator's host as this environment names it (loopback when none does)."""
    return config.text("PYCOLLECTIVE_MASTER_ADDR") or os.environ.get("MASTER_ADDR") or "127.0.0.1"


def _transports() -> dict:
    from pycollective import transports

    shm = "/dev/shm"
    if os.access(shm, os.W_OK):
        usage = shutil.disk_usage(shm)
        shm_line = f"available ({shm}, {usage.free / 2**30:.1f} GiB free)"
    else:
        shm_line = f"unavailable ({shm} not writable): ranks on one host will use tcp"
    forced = config.text("PYCOLLECTIVE_TRANSPORT")
    return {
        "shm": shm_line,
        "tcp": f"binds {_guard(lambda: transports.bind_address(None, _master_addr()))}",
        "grpc": f"grpcio {_package('grpcio')}",
        "forced": forced or "no (shm within a host, tcp across hosts)",
    }


def _tuning() -> str:
    from pycollective import tuning

    named = config.text("PYCOLLECTIVE_TUNING")
    if not named:
        return "none: algo='auto' uses the built-in cost model (run `pycollective tune`)"
    table = tuning.load(named)
    if table is None:
        return f"PYCOLLECTIVE_TUNING={named} does not exist yet: built-in cost model"
    return (
        f"PYCOLLECTIVE_TUNING={named}: {len(table.choices)} measured choices, costs for "
        f"{', '.join(sorted(table.costs)) or 'no transport'}"
    )


def _environment() -> dict:
    """Every PYCOLLECTIVE_* variable set, from the table; and any set that the table lacks,
    which is most likely a typo that pycollective ignores."""
    found = {
        k.name: ("<set>" if k.name in config.SECRET else config.raw(k.name))
        for k in config.KNOBS
        if config.raw(k.name)
    }
    for name in config.unknown_variables():
        found[name] = "not a pycollective variable: ignored (a typo?)"
    return dict(sorted(found.items()))


def collect() -> dict:
    """Everything the doctor reports, as a JSON-able dict."""
    return {
        "pycollective": _guard(_build),
        "python": f"{sys.version.split()[0]} ({sys.executable})",
        "platform": f"{platform.platform()} {platform.machine()}, {os.cpu_count()} CPUs",
        "packages": {name: _package(name) for name in _OPTIONAL_PACKAGES},
        "nccl": _guard(_nccl),
        "cuda devices": _guard(_cuda_devices),
        "transports": _guard(_transports),
        "tuning": _guard(_tuning),
        "environment": _environment() or "no PYCOLLECTIVE_* variable set",
    }


def _print(report: dict, indent: int = 0) -> None:
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{' ' * indent}{key}:")
            _print(value, indent + 2)
        else:
            print(f"{' ' * indent}{key}: {value}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument(
        "--help-env",
        action="store_true",
        help="list every PYCOLLECTIVE_* variable: type, default, meaning",
    )


def main(args: argparse.Namespace) -> int:
    if args.help_env:
        print(config.describe())
        return 0
    report = collect()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="pycollective doctor", description=__doc__)
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
