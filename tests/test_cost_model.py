"""The cost model across hosts (csrc/algorithms/link_load.h, pycollective/cost_model.py): a
host's ranks share one link, the link's rate comes from configuration or measurement, and the
model can be asked without forming a group. Measured on shaped namespaces (docs/benchmarks.md,
"Across hosts"), 64 MiB on 2 hosts x 2 ranks at 1 Gbit/s took hierarchical 0.6 s, ring 0.85 s,
halving_doubling 1.16 s: the model must order them so."""

from __future__ import annotations

import json

import pytest

from pycollective import config, cost_model
from pycollective.cost_model import HOST_LINK, estimate, layout, link_costs

MiB = 1 << 20
SHM = (3e-6, 1 / 8e9, 1 / 10e9)
GBIT = (40e-6, 8 / 1e9, 1 / 10e9)  # one host link of 1 Gbit/s each way


def test_two_hosts_of_two_ranks_order_as_measured():
    e = estimate(layout(2, 2), 64 * MiB, local=SHM, remote=GBIT)
    s = e.seconds
    assert s["hierarchical"] < s["ring"] < s["halving_doubling"], s
    assert e.auto == "hierarchical"
    assert "direct" in e.unsupported  # in-process replicas only
    # Each host link carries S each way for hierarchical (the link-bound limit, 0.537 s) and
    # 1.5 S for the ring; halving-doubling's first exchange puts both ranks' halves on it.
    link_bound = 64 * MiB * 8 / 1e9
    assert s["hierarchical"] == pytest.approx(link_bound, rel=0.05)
    assert s["ring"] == pytest.approx(1.5 * link_bound, rel=0.05)
    assert s["halving_doubling"] == pytest.approx(2 * link_bound, rel=0.05)


def test_ranks_of_a_host_share_its_link():
    # A ring over interleaved hosts crosses a host link at every step: twice the bytes per
    # link of the ring whose ranks are grouped by host.
    grouped = estimate([0, 0, 1, 1], 64 * MiB, local=SHM, remote=GBIT).seconds["ring"]
    interleaved = estimate([0, 1, 0, 1], 64 * MiB, local=SHM, remote=GBIT).seconds["ring"]
    assert interleaved == pytest.approx(2 * grouped, rel=0.05)


def test_one_rank_per_host_leaves_hierarchical_to_the_ring():
    e = estimate(layout(4, 1), 64 * MiB, local=SHM, remote=GBIT)
    assert e.auto in ("ring", "halving_doubling")
    assert e.seconds["ring"] == pytest.approx(1.5 * 64 * MiB * 8 / 1e9, rel=0.05)


def test_in_process_costs_apply_to_the_replica_count_they_were_fitted_at(tmp_path, monkeypatch):
    """A tune fits the in-process links at one replica count (4 by default): the threads' share
    of the cores it measured. Other counts keep the model's defaults, which price their own
    share: with the 4-replica fit, 2 replicas x 2 MiB priced halving-doubling 2x `inline`
    and ran `inline`, 1.2x slower."""
    import pycollective as pc

    slow = [1e-3, 1e-8, 1e-10]  # 1 ms a message: no default prices a link so
    tuning_file = tmp_path / "tuning.json"
    # The table's one entry is for another collective: the all-reduce shows the model's prices.
    entry = {"transport": "inproc", "world": 4, "collective": "broadcast", "max_bytes": 8}
    tuning_file.write_text(
        json.dumps(
            {
                "version": 1,
                "costs": {"inproc": slow},
                "choices": [dict(entry, algo="ring")],
            }
        )
    )
    monkeypatch.setenv("PYCOLLECTIVE_TUNING", str(tuning_file))
    ring_us = {}
    try:
        for replicas in (2, 4):
            said = pc.LocalCommunicator(replicas).explain("allreduce", 4096)
            ring_us[replicas] = float(said.split("ring=")[1].split("us")[0])
    finally:  # the groups read the variable into config: later tests start without it
        monkeypatch.delenv("PYCOLLECTIVE_TUNING")
        config.reload()
    assert ring_us[4] > 1000, ring_us  # 2(n-1) messages of 1 ms: the fit
    assert ring_us[2] < 100, ring_us  # the defaults


def test_the_link_rate_is_configured_or_measured(tmp_path, monkeypatch):
    tuning_file = tmp_path / "tuning.json"
    tuning_file.write_text(
        json.dumps({"version": 1, "costs": {HOST_LINK: [1e-4, 8 / 25e9, 1e-10]}, "choices": []})
    )
    try:
        config.reload({})
        assert link_costs()[1] == cost_model.DEFAULT_COSTS["tcp"]
        config.reload({"PYCOLLECTIVE_TUNING": str(tuning_file)})  # measured by link_probe
        assert link_costs()[1] == (1e-4, 8 / 25e9, 1e-10)
        config.reload({"PYCOLLECTIVE_TUNING": str(tuning_file), "PYCOLLECTIVE_LINK_GBITS": "10"})
        assert link_costs()[1] == (1e-4, 8 / 10e9, 1e-10)  # configured beats measured
        # The host link's 54 ms, plus the local phases over shm (13 ms at the defaults).
        hierarchical = estimate(layout(2, 2), 64 * MiB).seconds["hierarchical"]
        assert 64 * MiB * 8 / 10e9 < hierarchical < 1.3 * 64 * MiB * 8 / 10e9
        config.reload({"PYCOLLECTIVE_LINK_GBITS": "0"})
        with pytest.raises(ValueError, match="LINK_GBITS"):
            link_costs()
    finally:
        config.reload()


def test_one_host_is_priced_by_its_local_links_alone():
    # No message crosses a host: the remote cost must not matter.
    slow = estimate([0, 0, 0, 0], 16 * MiB, local=SHM, remote=(1.0, 1.0, 1.0)).seconds
    fast = estimate([0, 0, 0, 0], 16 * MiB, local=SHM, remote=GBIT).seconds
    assert slow == fast


def test_reduce_to_one_pays_the_root_hosts_link_for_remote_peers_only():
    # 2 x 2: the root's host-mate sends over shm; the two other ranks' messages come in over
    # the root host's link one after the other, and the result goes back out the same way.
    s = estimate(layout(2, 2), 64 * MiB, local=SHM, remote=GBIT).seconds["reduce_to_one"]
    assert s == pytest.approx(4 * 64 * MiB * 8 / 1e9, rel=0.05)


def test_ranks_that_outnumber_their_cores_take_turns():
    # 3 processes on 2 cores (docs/benchmarks-log.md, "Ranks that outnumber the cores"): the ring
    # needs all three in every step and measured 1.2x-1.35x halving-doubling and reduce_to_one
    # at 16-128 KiB.
    own_cores = estimate([0, 0, 0], 16 << 10, local=SHM, cores=0)
    shared = estimate([0, 0, 0], 16 << 10, local=SHM, cores=2)
    assert shared.auto != "ring", shared.seconds
    # Each of the ring's 4 steps waits for a parked rank; its bytes move at 2/3 of the speed.
    ring_bytes = own_cores.seconds["ring"] - 4 * SHM[0]
    assert shared.seconds["ring"] == pytest.approx(4 * (SHM[0] + 6e-6) + 1.5 * ring_bytes)
    # Halving-doubling's three steps (the fold, one exchange of the whole vector, the unfold)
    # keep two of the three ranks busy: they only wait.
    assert shared.seconds["halving_doubling"] == pytest.approx(
        own_cores.seconds["halving_doubling"] + 3 * 6e-6
    )
    # Large messages too: the ring moves the fewest bytes per rank, but all three ranks share
    # the two cores in each of its steps, where the fold runs one way on two cores (below).
    # Measured with the ranks bound: halving-doubling 1.32x-1.37x faster than the ring at
    # 4-16 MiB.
    assert estimate([0, 0, 0], 4 * MiB, local=SHM, cores=2).auto == "halving_doubling"


def test_the_fold_between_processes_runs_one_way_on_two_cores():
    # The third rank's data goes in (reduced on arrival) and the result comes back, one way each
    # time: over shared memory the sender copies in while the receiver copies (or reduces) out,
    # so each direction costs half of beta (an exchange's price, in which each rank makes both
    # copies) and the reduction overlaps the sender's copy. Everything else about 3 ranks is 2
    # ranks' schedule (256 KiB stays in cache either way).
    S = 256 << 10
    two = estimate([0, 0], S, local=SHM, cores=0).seconds["halving_doubling"]
    three = estimate([0, 0, 0], S, local=SHM, cores=0).seconds["halving_doubling"]
    alpha, beta, gamma = SHM
    assert three - two == pytest.approx(2 * alpha + max(S * beta / 2, S * gamma) + S * beta / 2)


def test_cores_are_counted_per_host():
    # 2 hosts x 2 ranks on hosts of 2 cores: nobody waits; on hosts of 1 core, everyone does.
    own = estimate(layout(2, 2), 1 * MiB, local=SHM, remote=GBIT, cores=0).seconds
    assert estimate(layout(2, 2), 1 * MiB, local=SHM, remote=GBIT, cores=2).seconds == own
    crowded = estimate(layout(2, 2), 1 * MiB, local=SHM, remote=GBIT, cores=1).seconds
    assert all(
        crowded[a] > own[a] for a in ("ring", "halving_doubling", "reduce_to_one", "hierarchical")
    )
