"""The short version of the fault soak (bench/fault_soak.py; figures in docs/reliability.md):
jobs whose ranks loop random collectives, checked against numpy, while one rank is SIGKILLed
or SIGSTOPped at a random moment; and a fuzzer of the gRPC control plane. Each round asserts:
no hang (hard deadlines), every survivor raises within 10 s naming the culprit, no wrong result
accepted, no crash, nothing accepted without the token. The tcp data plane's fuzzer is native
(tests/native/test_tcp.cc, under AddressSanitizer in CI)."""

from __future__ import annotations

import random

import pytest

from pycollective.bench import fault_soak
from pycollective.bench.fault_fuzz import fuzz_control_plane


def _check(result: dict) -> None:
    assert result["problems"] == [], result
    assert result["hung"] == 0 and result["wrong"] == 0, result


@pytest.mark.timeout(600)
def test_sigkill_at_random_points():
    """8 rounds: 3-4 ranks, random transport (tcp, shm, grpc, encrypted tcp), collectives,
    sizes, dtypes and algorithms; one random rank (the coordinator's host too) killed."""
    rng = random.Random(17)
    rounds = [fault_soak.kill_round(rng) for _ in range(8)]
    for result in rounds:
        _check(result)
        assert len(result["detect_s"]) == result["world"] - 1, result
    assert sum(r["calls"] for r in rounds) > 0


@pytest.mark.timeout(120)
def test_a_job_that_does_not_form_says_how_each_rank_ended():
    from pycollective.bench import fault_ranks

    # Every rank refuses the transport and exits 1 before it could report ready.
    with pytest.raises(RuntimeError, match=r"did not form the group \(rank 0: exit 1, rank 1"):
        fault_ranks.start_job(2, "tcp", seed=1, env={"PYCOLLECTIVE_TRANSPORT": "pigeon"})


@pytest.mark.timeout(300)
def test_sigstop_within_the_heartbeat_timeout_is_survived():
    result = fault_soak.stop_round(random.Random(3), past_timeout=False)
    _check(result)
    assert result["calls"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [0, 2], ids=["the coordinator's host", "another rank"])
def test_sigstop_past_the_heartbeat_timeout_is_reported(victim):
    """A rank frozen for 12 s (heartbeat timeout 3 s): the others raise within 10 s, naming it.
    Rank 0 hosts the coordinator: the others notice that no heartbeat is answered."""
    result = fault_soak.stop_round(random.Random(5), past_timeout=True, victim=victim)
    _check(result)
    assert len(result["detect_s"]) == result["world"] - 1, result


@pytest.mark.timeout(300)
def test_sigstop_with_the_default_heartbeat_timeout_is_reported_within_10_s():
    """The promise holds with the shipped default too, not only with the suite's 3 s: rank 0
    (the coordinator's host, the slower case: the others must notice unanswered heartbeats)
    frozen for 12 s, PYCOLLECTIVE_HEARTBEAT_TIMEOUT unset."""
    result = fault_soak.stop_round(
        random.Random(6), past_timeout=True, victim=0, heartbeat_timeout=None
    )
    _check(result)
    assert len(result["detect_s"]) == result["world"] - 1, result
    assert max(result["detect_s"]) <= fault_soak.DETECT_WITHIN_S, result


@pytest.mark.timeout(300)
def test_control_plane_fuzz_accepts_nothing_without_the_token():
    result = fuzz_control_plane(1500, seed=11)
    assert result["violations"] == [], result
    answers = result["answers"]
    # Both halves ran: refused strangers, and the group's own malformed calls answered.
    assert answers.get("noauth:UNAUTHENTICATED", 0) > 300, answers
    assert sum(v for k, v in answers.items() if k.startswith("auth:")) == 750, answers
    assert not any(k.startswith("noauth:") and k.split(":")[1] == "OK" for k in answers)


def _network_or_skip() -> None:
    from pycollective.bench import fault_network

    why = fault_network.skip_reason()
    if why:
        pytest.skip(f"network faults need namespace hosts: {why}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("past_timeout", "victim"),
    [(False, 1), (True, 0), (True, 2)],
    ids=["briefly", "the coordinator's host, past the timeout", "another host, past the timeout"],
)
def test_network_partition_between_hosts(past_timeout, victim):
    """3 namespace hosts, one rank each; one host cut off for 12 s (the others raise within
    10 s, naming its rank) or for 0.9 s (the job goes on). The brief cut runs over plain tcp
    here: over encrypted tcp it once left the cut-off rank unfinished after 40 s in CI, not
    reproduced since nor explained (docs/reliability.md, "still open"); the soak command keeps
    every transport in its rounds."""
    from pycollective.bench import fault_network

    _network_or_skip()
    result = fault_network.partition_round(
        random.Random(7),
        past_timeout=past_timeout,
        victim=victim,
        transport=None if past_timeout else "tcp",
    )
    _check(result)
    if past_timeout:
        assert len(result["detect_s"]) == result["world"] - 1, result
    else:
        assert result["calls"] > 0


@pytest.mark.timeout(300)
def test_packet_loss_and_delay_between_hosts():
    from pycollective.bench import fault_network

    _network_or_skip()
    result = fault_network.loss_delay_round(random.Random(9))
    if "skipped" in result:
        pytest.skip(result["skipped"])
    _check(result)
    if "frames" in result:  # the user-space relay did it: it dropped and delayed for real
        assert result["frames"]["dropped"] > 0 and result["frames"]["delayed"] > 0, result
    assert result["calls"] > 0
