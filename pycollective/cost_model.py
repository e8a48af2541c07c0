"""The alpha-beta-gamma cost model that ``algo="auto"`` chooses by: where its link costs come
from, and a way to ask it for estimates without forming a group.

Each kind of link has a cost ``(alpha, beta, gamma)``: seconds per message, per byte moved, per
byte reduced. Ranks on one host talk over ``local`` links (shm); ranks on different hosts over
``remote`` ones, whose ``beta`` is one host's network link, each direction, shared by all of the
host's ranks (csrc/algorithms/link_load.h: the algorithms price each step by its busiest host
link). The remote cost is, in this order:

1. ``PYCOLLECTIVE_LINK_GBITS``: the host link's rate as configured by the user (its beta; alpha
   and gamma stay the transport's);
2. ``"host_link"`` in the tuning file (``PYCOLLECTIVE_TUNING``), measured across hosts by
   ``python -m pycollective.bench.link_probe`` run under the cluster's launcher;
3. the transport's cost (``"tcp"``): ``pycollective tune``'s, measured on one host, else the
   defaults below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pycollective import config, tuning
from pycollective._calls import KINDS
from pycollective._ext import _C

Cost = tuple[float, float, float]

# Defaults per transport: (alpha s/message, beta s/byte, gamma s/byte reduced).
# `pycollective tune` measures them on a cluster (PYCOLLECTIVE_TUNING).
DEFAULT_COSTS: dict[str, Cost] = {
    "shm": (3e-6, 1 / 8e9, 1 / 10e9),
    "tcp": (40e-6, 1 / 2.5e9, 1 / 10e9),
    "grpc": (300e-6, 1 / 0.5e9, 1 / 10e9),
}

#: The tuning file's key for the cross-host link measured by bench/link_probe.py.
HOST_LINK = "host_link"


def link_costs(local: str = "shm", remote: str = "tcp") -> tuple[Cost, Cost]:
    """(local, remote) costs for a group whose same-host peers use transport `local` and whose
    other-host peers use `remote`, from the defaults, the tuning file and the configuration."""
    tuned = tuning.load()
    costs = dict(DEFAULT_COSTS, **(tuned.costs if tuned else {}))
    remote_cost = costs[remote]
    if remote == "tcp" and HOST_LINK in costs:
        remote_cost = costs[HOST_LINK]
    gbits = config.get("PYCOLLECTIVE_LINK_GBITS")
    if gbits is not None:
        if float(gbits) <= 0:
            raise ValueError(f"PYCOLLECTIVE_LINK_GBITS={gbits} must be a positive rate in Gbit/s")
        remote_cost = (remote_cost[0], 8 / (float(gbits) * 1e9), remote_cost[2])
    return costs[local], remote_cost


@dataclass(frozen=True)
class Estimate:
    """The model's view of one call: seconds per algorithm that can run it, why the others
    cannot, and the algorithm ``auto`` picks by the model (a tuned table is not consulted)."""

    seconds: dict[str, float]
    unsupported: dict[str, str]
    auto: str


def estimate(
    host_of: Sequence[int],
    nbytes: int,
    collective: str = "allreduce",
    local: Cost | None = None,
    remote: Cost | None = None,
    cores: int | None = None,
) -> Estimate:
    """The model's estimate for a float32 `collective` of `nbytes` per rank on ranks laid out as
    `host_of` (the host of each rank, e.g. ``[0, 0, 1, 1]`` for 2 hosts x 2 ranks), seen from
    rank 0, with no group formed. Costs default to :func:`link_costs`'s. `cores` is each
    host's core count, which the ranks of a host share where they outnumber it (default: this
    machine's, as a group formed here would see it; 0: every rank has a core of its own).

    >>> estimate([0, 0, 1, 1], 64 << 20).auto
    'hierarchical'
    """
    if collective not in KINDS:
        raise ValueError(f"unknown collective {collective!r}; choose one of {sorted(KINDS)}")
    if local is None or remote is None:
        default_local, default_remote = link_costs()
        local, remote = local or default_local, remote or default_remote
    spec = _C.CallSpec(
        kind=KINDS[collective], count=nbytes // 4, dtype=_C.enum_codes()["dtype"]["float32"]
    )
    rows, pick = _C.model_estimates(
        host_of=list(host_of),
        local=local,
        remote=remote,
        spec=spec,
        cores=-1 if cores is None else cores,
    )
    return Estimate(
        seconds={a: s for a, s, _ in rows if s is not None},
        unsupported={a: why for a, s, why in rows if s is None},
        auto=pick,
    )


def layout(hosts: int, ranks_per_host: int) -> list[int]:
    """host_of for `hosts` hosts of `ranks_per_host` consecutive ranks each."""
    return [r // ranks_per_host for r in range(hosts * ranks_per_host)]
