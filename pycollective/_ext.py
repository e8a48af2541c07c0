"""Loads the native extension once, and handles the one way that goes wrong for newcomers.

From the root of a source checkout, Python puts the current directory first on ``sys.path``, so
``import pycollective`` finds the source folder ``pycollective/``, which holds no compiled
``_C``, instead of the installed package. Two cases:

- The process was started by pycollective itself (benchmark ranks, launcher workers,
  parameter-server tasks): its parent set ``PYCOLLECTIVE_PACKAGE_DIR`` to the package it runs
  from (see ``pycollective._spawn``), and the import is redirected there, so these processes
  run the installed package whatever their current directory is.
- Anything else (a user's own script): one ImportError that says why and what to do, the way
  numpy and torch do, instead of a bare ``cannot import name '_C'``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES

# Set by pycollective._spawn for the processes pycollective starts.
PACKAGE_DIR_VARIABLE = "PYCOLLECTIVE_PACKAGE_DIR"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _installed_package_dir() -> str | None:
    """The package folder a parent pycollective process named, if it is not this folder and
    holds a package. Read by hand, not through pycollective.config: this runs before the
    extension, which holds the table of variables, is loaded."""
    named = os.environ.get(PACKAGE_DIR_VARIABLE, "")
    if not named or not os.path.isfile(os.path.join(named, "__init__.py")):
        return None
    if os.path.realpath(named) == os.path.realpath(_HERE):
        return None
    return named


def _import_from(package_dir: str) -> None:
    """Makes ``package_dir`` the ``pycollective`` package of this process. Python's import
    returns whatever ``sys.modules["pycollective"]`` holds once the source folder's
    ``__init__`` finishes, so the source folder's module object is then dropped."""
    for name in [n for n in sys.modules if n == "pycollective" or n.startswith("pycollective.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "pycollective",
        os.path.join(package_dir, "__init__.py"),
        submodule_search_locations=[package_dir],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycollective"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["pycollective"]
        raise


def _load():
    """The native module. When it is missing here and a parent process named the installed
    package, that package becomes ``pycollective`` and its extension is returned; the rest of
    the source folder's ``__init__`` then imports from the installed modules, already in
    ``sys.modules``. Otherwise raises ImportError with the remedy."""
    try:
        from pycollective import _C

        return _C
    except ImportError as exc:
        installed = _installed_package_dir()
        if installed is not None:
            _import_from(installed)
            return importlib.import_module("pycollective._C")
        built = [
            f
            for f in os.listdir(_HERE)
            if f.startswith("_C.") and f.endswith(tuple(EXTENSION_SUFFIXES))
        ]
        if not built:
            raise ImportError(
                f"pycollective was imported from its source folder {_HERE}, which has no "
                "compiled extension (pycollective._C): the current directory, or a folder on "
                "PYTHONPATH, holds the repository. Either run Python from another directory so "
                "that the installed package is imported (`pip install .` first), or build the "
                "extension in place with `pip install --no-build-isolation -e .` (see "
                "docs/building.md)."
            ) from None
        raise ImportError(
            f"pycollective's native extension in {_HERE} failed to load: {exc}. Reinstall "
            "pycollective (`pip install --force-reinstall pycollective`) for this Python."
        ) from exc


_C = _load()

__all__ = ["_C"]
