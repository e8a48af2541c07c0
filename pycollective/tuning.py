"""The tuning file written by ``pycollective tune`` and read at group creation.

``PYCOLLECTIVE_TUNING`` names a JSON file::

    {"version": 1,
     "costs":   {"shm": [alpha, beta, gamma], "tcp": [...], "inproc": [...]},
     "choices": [{"transport": "shm", "world": 2, "collective": "allreduce",
                  "max_bytes": 8192, "algo": "halving_doubling"}, ...]}

``costs`` replace the cost model's defaults per transport (seconds per message, per byte moved,
per byte reduced; ``inproc`` for groups of the replica count it was fitted at alone, the count of
the ``inproc`` choices); ``choices`` are measured winners that ``algo="auto"`` follows for groups
of that transport and size, the cost model deciding everything else.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from pycollective import config
from pycollective._calls import KINDS

VERSION = 1


@dataclass
class Tuning:
    costs: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    choices: list[dict] = field(default_factory=list)
    path: str = ""

    def table(self, transport: str, world: int) -> list[tuple[int, int, str]]:
        """(collective kind, max bytes, algorithm) rows for one kind of group, sorted."""
        rows = [
            (KINDS[c["collective"]], int(c["max_bytes"]), c["algo"])
            for c in self.choices
            if c["transport"] == transport and int(c["world"]) == world
        ]
        return sorted(rows)

    def inproc_costs(self, replicas: int) -> tuple[float, float, float] | None:
        """The in-process link costs for a group of ``replicas``: the fitted ones where the tune
        measured that many replicas (its in-process table's count), else None (the model's
        defaults, which price each count's share of the cores). A fit describes the share it
        was measured with: fitted at 4 replicas on 2 vCPUs (two threads a core) it priced the
        links of 2 replicas, each with a core, 2x too slow against ``inline``'s own model, and
        ``auto`` at 2 replicas x 2 MiB kept ``inline``, 1.2x halving-doubling's time, in two
        tuned sweeps (docs/benchmarks-log.md, forty-second session)."""
        cost = self.costs.get("inproc")
        fitted_at = {int(c["world"]) for c in self.choices if c["transport"] == "inproc"}
        return cost if cost is not None and replicas in fitted_at else None

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            "costs": {k: list(v) for k, v in self.costs.items()},
            "choices": self.choices,
        }


def load(path: str | None = None) -> Tuning | None:
    """The tuning named by `path` or PYCOLLECTIVE_TUNING; None when neither names a file.
    A file that is named but unreadable is an error: a silently ignored tuning would leave the
    user believing it applied."""
    path = path or config.text("PYCOLLECTIVE_TUNING")
    if not path:
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        return None  # not tuned yet: the cost model's defaults apply
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"PYCOLLECTIVE_TUNING={path}: cannot read the tuning file ({exc}); "
            "re-run `pycollective tune` or unset the variable"
        ) from None
    try:
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}, expected {VERSION}")
        costs = {k: tuple(float(x) for x in v) for k, v in raw.get("costs", {}).items()}
        if any(len(v) != 3 for v in costs.values()):
            raise ValueError("every cost needs [alpha, beta, gamma]")
        choices = list(raw.get("choices", []))
        for c in choices:
            if c["collective"] not in KINDS:
                raise ValueError(f"unknown collective {c['collective']!r}")
            int(c["world"]), int(c["max_bytes"]), str(c["algo"]), str(c["transport"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"PYCOLLECTIVE_TUNING={path}: malformed tuning file ({exc}); re-run `pycollective tune`"
        ) from None
    return Tuning(costs, choices, path)


def save(tuning: Tuning, path: str) -> None:
    """Writes atomically (temp file + rename), so a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(tuning.to_json(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
