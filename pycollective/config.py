"""Every PYCOLLECTIVE_* environment variable, and the one way Python code reads them.

The table is the extension's (csrc/core/knobs.h, through ``_C.knob_table()``): declared once,
for both sides. The environment is read once, at import, into a snapshot; :func:`reload` reads
it again (``pc.init()`` and new in-process groups do, on both sides, so that a variable set
before a group is created applies to it). Nothing on a collective's path reads the environment.

Arguments beat the environment; the environment beats the default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pycollective._ext import _C


@dataclass(frozen=True)
class Knob:
    """One variable: its name, type ("int", "float" or "str"), default (as text; "" for none)
    and meaning."""

    name: str
    type: str
    default: str
    doc: str


KNOBS: list[Knob] = [Knob(*row) for row in _C.knob_table()]
_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
# Values are secrets: shown as set, never printed.
SECRET = {"PYCOLLECTIVE_TOKEN"}

_snapshot: dict[str, str] = {}


def reload(environ: Mapping[str, str] | None = None) -> None:
    """Reads every variable of the table again, on both sides (Python and native)."""
    env = os.environ if environ is None else environ
    _snapshot.clear()
    _snapshot.update({k.name: env.get(k.name, "") for k in KNOBS})
    _C.reload_knobs()
    # The Python side's level and subsystems (pycollective/log.py, once it has loaded).
    apply_log_settings = getattr(sys.modules.get("pycollective.log"), "apply_settings", None)
    if apply_log_settings is not None:
        apply_log_settings()


def knob(name: str) -> Knob:
    """The table's entry; a name the table lacks is a programming error, said so."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"{name} is not in the table of PYCOLLECTIVE_* variables (csrc/core/knobs.h); "
            "declare it there first"
        ) from None


def raw(name: str) -> str:
    """The variable as set at the last (re)load, or "" when unset."""
    knob(name)
    return _snapshot.get(name, "")


def get(name: str, default: int | float | str | None = None) -> int | float | str | None:
    """The variable's value, parsed by its type: as set, else ``default`` when given, else the
    table's default (None when the table has none). A malformed value is a ValueError that
    names the variable."""
    entry = knob(name)
    text = raw(name)
    if text == "":
        if default is not None:
            return default
        text = entry.default
        if text == "":
            return None if entry.type != "str" else ""
    if entry.type == "str":
        return text
    try:
        return int(text) if entry.type == "int" else float(text)
    except ValueError:
        kind = "an integer" if entry.type == "int" else "a number"
        raise ValueError(f"{name}={text!r} is not {kind}") from None


def text(name: str) -> str:
    """A string variable's value ("" when unset and the table has no default)."""
    return str(get(name) or "")


def env_int(name: str, default: int) -> int:
    """An integer variable, or ``default`` when unset."""
    return int(get(name, default))  # type: ignore[arg-type]


def env_float(name: str, default: float) -> float:
    """A numeric variable, or ``default`` when unset."""
    return float(get(name, default))  # type: ignore[arg-type]


def default_timeout() -> float:
    return env_float("PYCOLLECTIVE_TIMEOUT", 300.0)


def heartbeat_timeout() -> float:
    """Seconds of silence after which a rank (or, seen from a rank, the coordinator) counts as
    frozen or cut off. The default lives in the knob table alone: the fault suite promises that
    survivors raise within 10 s, and detection takes up to about 2 s past this window."""
    return float(get("PYCOLLECTIVE_HEARTBEAT_TIMEOUT"))  # type: ignore[arg-type]


def unknown_variables() -> list[str]:
    """PYCOLLECTIVE_* variables set in the environment that the table lacks (typos)."""
    return sorted(n for n in os.environ if n.startswith("PYCOLLECTIVE_") and n not in _BY_NAME)


def markdown_table() -> str:
    """The table as Markdown: docs/configuration.md holds exactly this (a test checks it)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        rows.append(f"| `{k.name}` | {k.type} | {k.default or '-'} | {k.doc} |")
    return "\n".join(rows) + "\n"


def describe() -> str:
    """The table as text: for ``pycollective doctor --help-env`` and docs/configuration.md."""
    lines = []
    for k in KNOBS:
        default = f" (default {k.default})" if k.default else ""
        lines.append(f"{k.name}  [{k.type}]{default}\n    {k.doc}")
    return "\n".join(lines)


reload()
