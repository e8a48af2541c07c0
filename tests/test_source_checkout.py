"""A newcomer's first commands, run where they type them: from a directory that holds a
``pycollective/`` folder which is not the installed package (the root of a source checkout, or
any decoy). Processes that pycollective starts must import the installed package; a user's own
``import pycollective`` of an unbuilt source folder must fail with one message saying what to do.
Also ``pycollective --version`` and ``pycollective doctor``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pycollective

INSTALLED = os.path.dirname(os.path.abspath(pycollective.__file__))
SOURCE_FOLDER = Path(__file__).resolve().parents[1] / "pycollective"
# The console script, as a user types it: it never puts the current directory on sys.path.
CLI = [os.path.join(os.path.dirname(sys.executable), "pycollective")]


def _run(args: list[str], cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYCOLLECTIVE_PACKAGE_DIR"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def decoy_dir(tmp_path: Path) -> Path:
    """A directory whose pycollective/ is a package that aborts any process importing it."""
    (tmp_path / "pycollective").mkdir()
    (tmp_path / "pycollective" / "__init__.py").write_text(
        "raise SystemExit('the decoy pycollective package was imported')\n"
    )
    return tmp_path


@pytest.fixture
def checkout_root(tmp_path: Path) -> Path:
    """A directory holding a copy of this repository's source folder, without a built _C:
    what a fresh clone's root looks like after `pip install .`."""
    if not (SOURCE_FOLDER / "_ext.py").exists():
        pytest.skip("the tests do not sit in a source checkout")
    if os.path.samefile(SOURCE_FOLDER, INSTALLED):
        pytest.skip("editable install: the source folder is the installed package")
    shutil.copytree(
        SOURCE_FOLDER,
        tmp_path / "pycollective",
        # what a fresh clone has, the type stubs _C.pyi included, without a compiled extension
        ignore=shutil.ignore_patterns("_C.*.so", "_C.so", "__pycache__"),
    )
    return tmp_path


@pytest.mark.timeout(120)
def test_benchmark_ranks_import_the_installed_package_beside_a_decoy(decoy_dir):
    res = _run(
        CLI
        + [
            "bench",
            "--world",
            "2",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "3",
            "-w",
            "1",
            "--budget",
            "0.05",
            "--algos",
            "ring",
            "--peers",
            "",
        ],
        decoy_dir,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "decoy" not in res.stdout + res.stderr
    assert "all results correct" in res.stdout


@pytest.mark.timeout(60)
def test_module_command_ignores_the_current_directory(decoy_dir):
    from pycollective._spawn import python_module_command

    res = _run(python_module_command("pycollective.doctor", "--json"), decoy_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["pycollective"]["package"] == INSTALLED


@pytest.mark.timeout(90)
def test_launcher_ranks_import_the_installed_package_from_a_checkout_root(checkout_root):
    program = (
        "import numpy, pycollective as pc; pc.init(); "
        "print('package', pc.__file__, pc.allreduce(numpy.ones(2)).tolist())"
    )
    res = _run(
        CLI + ["run", "-n", "2", "--timeout", "60", sys.executable, "-c", program], checkout_root
    )
    assert res.returncode == 0, res.stdout + res.stderr
    expected = f"package {os.path.join(INSTALLED, '__init__.py')} [2.0, 2.0]"
    assert res.stdout.count(expected) == 2, res.stdout


@pytest.mark.timeout(60)
def test_own_script_from_a_checkout_root_gets_one_clear_error(checkout_root):
    res = _run([sys.executable, "-c", "import pycollective"], checkout_root)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pycollective was imported from its source folder")
    assert "run Python from another directory" in last and "pip install" in last
    assert "-e ." in last
    assert "cannot import name" not in res.stderr  # no chained, confusing cause


@pytest.mark.timeout(60)
def test_version_names_version_and_commit(tmp_path):
    res = _run(CLI + ["--version"], tmp_path)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert line.startswith(f"pycollective {pycollective.__version__} (commit ")
    assert ("CUDA" if pycollective.build_info()["cuda"] else "CPU-only") in line


@pytest.mark.timeout(60)
def test_doctor_reports_build_libraries_transports_tuning_and_variables(tmp_path):
    env_table = tmp_path / "tuning.json"
    res = subprocess.run(
        CLI + ["doctor", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYCOLLECTIVE_TOKEN="s3cret", PYCOLLECTIVE_TUNING=str(env_table)),
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    build = report["pycollective"]
    assert build["version"] == pycollective.__version__ and build["commit"]
    assert build["package"] == INSTALLED and "cuda" in build and "simd" in build
    assert set(report["packages"]) >= {"numpy", "torch", "jax", "nvidia-nccl-cu12"}
    assert report["nccl"]  # found with a path, or "not found (tried: ...)"
    assert report["transports"]["shm"] and report["transports"]["tcp"]
    assert str(env_table) in report["tuning"]
    assert report["environment"]["PYCOLLECTIVE_TOKEN"] == "<set>"  # secrets are not printed
    assert "s3cret" not in res.stdout
    human = _run(CLI + ["doctor"], tmp_path)
    assert human.returncode == 0 and "transports:" in human.stdout
