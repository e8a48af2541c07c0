"""Every server of a job binds only the address its peers dial: loopback for a single-host job,
all interfaces only when PYCOLLECTIVE_IFNAME asks for them. Checked on the listening sockets
themselves (/proc), sampled from inside each rank while the group forms, so that listeners that
live only during link setup are seen too."""

from __future__ import annotations

import ipaddress

import numpy as np
import pytest
from listening import Sampler, listening
from multiproc import run_ranks


def _listeners_while_forming(rank, n):
    import pycollective as pc

    sampler = Sampler()
    pc.init()
    pc.allreduce(np.ones(1000, np.float32), algo="ring")
    pc.barrier()
    seen = sampler.stop()
    return sorted(seen)


def _sample_job(ranks: int, env: dict, least: int = 1) -> list:
    """Each rank's listeners while its job formed. A data listener lives only for the few
    milliseconds of link setup, and a loaded machine can keep the sampling thread off the core
    for all of them (CI once saw none on rank 1 of 2): a rank that saw fewer than ``least``
    listeners (rank 0: one more, the coordinator) says nothing about addresses, so the job runs
    again, up to three times in all."""
    for _ in range(3):
        res = run_ranks(_listeners_while_forming, ranks, timeout=90, env=env)
        if all(len(seen) >= least + (rank == 0) for rank, seen in enumerate(res)):
            break
    return res


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["tcp", "grpc", "shm"])
def test_a_single_host_job_listens_on_loopback_only(transport):
    res = _sample_job(3, {"PYCOLLECTIVE_TRANSPORT": transport})
    for rank, seen in enumerate(res):
        # rank 0: the coordinator and its data listener(s); others: their data listener(s).
        assert len(seen) >= (2 if rank == 0 else 1), (rank, seen)
        for address, port in seen:
            assert ipaddress.ip_address(address).is_loopback, (rank, address, port, transport)


@pytest.mark.timeout(300)
def test_all_interfaces_only_when_asked():
    """The same sampling sees 0.0.0.0 when PYCOLLECTIVE_IFNAME asks for it (so the test above
    would see an all-interfaces listener)."""
    res = _sample_job(2, {"PYCOLLECTIVE_TRANSPORT": "tcp", "PYCOLLECTIVE_IFNAME": "0.0.0.0"})
    for rank, seen in enumerate(res):
        assert "0.0.0.0" in {address for address, _ in seen}, (rank, seen)


@pytest.mark.timeout(60)
def test_parameter_server_tasks_listen_on_their_own_address():
    from pycollective.strategies import Server

    cluster = {"ps": ["127.0.0.1:0"], "worker": ["localhost:0"]}
    servers = [Server(cluster, job, 0, token="t") for job in ("ps", "worker")]
    try:
        ports = {int(s.address.rsplit(":", 1)[1]) for s in servers}
        mine = {(a, p) for a, p in listening() if p in ports}
        assert {p for _, p in mine} == ports, mine
        assert all(ipaddress.ip_address(a).is_loopback for a, _ in mine), mine
    finally:
        for s in servers:
            s.stop(0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("toward", "ifname", "bound"),
    [
        ("127.0.0.1", None, "127.0.0.1"),
        ("localhost", None, "127.0.0.1"),
        ("::1", None, "::1"),
        ("10.0.0.5", "127.0.0.1", "127.0.0.1"),  # an address given explicitly
        ("10.0.0.5", "0.0.0.0", "0.0.0.0"),  # all interfaces, asked for
        ("127.0.0.1", "lo", "127.0.0.1"),  # an interface's address
    ],
)
def test_server_host(toward, ifname, bound):
    from pycollective.rendezvous.addresses import server_host

    assert server_host(toward, ifname) == bound
