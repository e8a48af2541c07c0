"""Shared helpers for the tests/test_strategies_*.py files (this module has no tests).

``strategies`` is the ``pycollective.strategies`` package. An editable install made before
``strategies/__init__.py`` existed does not map it yet; then the package is loaded from the
source tree under its real name, so the tests run the same code either way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pycollective

ROOT = Path(__file__).resolve().parents[1]


def import_strategies():
    try:
        return importlib.import_module("pycollective.strategies")
    except ModuleNotFoundError:
        pass
    folder = ROOT / "strategies"
    spec = importlib.util.spec_from_file_location(
        "pycollective.strategies", folder / "__init__.py",
        submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycollective.strategies"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("pycollective.strategies", None)
        raise
    pycollective.strategies = module
    return module


strategies = import_strategies()
