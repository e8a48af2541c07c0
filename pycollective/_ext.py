"""Loads the native extension once, with an explanation when it is missing."""

from __future__ import annotations

import os

try:
    from pycollective import _C  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - depends on how the package was installed
    here = os.path.dirname(os.path.abspath(__file__))
    raise ImportError(
        "pycollective's native extension (pycollective._C) is not built in "
        f"{here}. Install the package (`pip install .` or "
        "`pip install --no-build-isolation -e .`) and run Python from outside the source "
        "tree (use `pytest`, not `python -m pytest`, from the repository root), so that the "
        f"installed package is imported instead of the source folder. Original error: {exc}"
    ) from exc

__all__ = ["_C"]
