"""Every tool the docs name as ``pycollective NAME`` starts from the root of a checkout.

From there ``python -m pycollective.bench.X`` imports the source folder, which has no compiled
extension, and stops with an ImportError; the documented commands are the console script's
subcommands instead, which must import the installed package from any directory."""

from __future__ import annotations

import os
import subprocess

import pytest

from pycollective import cli
from pycollective._ext import PACKAGE_DIR_VARIABLE
from pycollective._spawn import python_module_command

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(cli._forwarded()))
def test_forwarded_tool_starts_from_the_checkout_root(name):
    # What the console script does: no current directory on sys.path, and no package folder
    # inherited from a pycollective parent (that would redirect the import and hide a failure).
    env = {k: v for k, v in os.environ.items() if k != PACKAGE_DIR_VARIABLE}
    done = subprocess.run(
        python_module_command("pycollective.cli", name, "--help"),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, f"pycollective {name} --help failed:\n{done.stdout}{done.stderr}"
    assert "usage:" in done.stdout
