"""Network faults between hosts: the ranks of a job run in network namespaces on a bridge
(bench/netns_cluster.py, one rank per host, started the torchrun way) and loop random collectives
(bench/fault_ranks.py) while the network between the hosts fails:

- partition: one host's link goes down (its bridge port), for longer than the heartbeat timeout
  (the others must raise within 10 s, naming the rank behind it) or for a moment (TCP carries
  the job over it: the job must go on, every result right);
- loss and delay: netem on every host's link (``loss 2% delay 20ms``) while the job runs; it must
  go on, every result right. Needs the kernel's sch_netem: where it is missing (as on the
  machine this was written on, whose kernel also lacks tc's actions and iptables, so random
  drops cannot be made another way) the round is skipped, saying so.

Root only (namespaces, a bridge, tc); ``skip_reason()`` says why not elsewhere.
"""

from __future__ import annotations

import random
import subprocess
import time

from .fault_ranks import finish, start_job
from .impaired_link import ImpairedLinks, relay_missing
from .netns_cluster import ClusterError, NetnsCluster, check_can_build

HEARTBEAT_TIMEOUT_S = 3.0
TRANSPORTS = ("tcp", "tcp+aes", "grpc")
_ENV = {"PYCOLLECTIVE_TIMEOUT": "60", "PYCOLLECTIVE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)}


def skip_reason() -> str:
    """ "" when namespace clusters can be built here, else why not."""
    try:
        check_can_build()
    except ClusterError as exc:
        return str(exc)
    return ""


def netem_missing(cluster: NetnsCluster) -> str:
    """ "" when netem works on this kernel, else the reason it does not."""
    try:
        cluster.shape(0, "none", "delay 1ms")
        cluster.shape(0, "none")
    except ClusterError as exc:
        return f"loss and delay need sch_netem, which this kernel lacks: {exc}".splitlines()[0]
    return ""


def _link(cluster: NetnsCluster, host: int, state: str) -> None:
    subprocess.run(
        ["ip", "link", "set", cluster.bridge_port(host), state], check=True, capture_output=True
    )


def partition_round(
    rng: random.Random,
    past_timeout: bool,
    hosts: int = 3,
    victim: int | None = None,
    transport: str | None = None,
) -> dict:
    """Cuts host ``victim`` off (None: a random one; host 0 runs the coordination service;
    its rank is the culprit) for 12 s, or for 0.3 x the heartbeat timeout, with the job on
    ``transport`` (None: a random one of TRANSPORTS); returns the judged round
    (bench/fault_soak.py's format)."""
    from .fault_soak import STOPPED_PAST_S, _judge

    chosen, seed = rng.choice(TRANSPORTS), rng.getrandbits(32)
    transport = transport or chosen
    victim = rng.randrange(hosts) if victim is None else victim
    with NetnsCluster(hosts, 1, master_port=29500 + rng.randrange(1000)) as cluster:
        job = start_job(hosts, transport, seed, env=_ENV, cluster=cluster)
        time.sleep(rng.uniform(0.2, 1.0))
        at = time.monotonic()
        _link(cluster, victim, "down")
        time.sleep(STOPPED_PAST_S if past_timeout else HEARTBEAT_TIMEOUT_S * 0.3)
        _link(cluster, victim, "up")
        reports = finish(job, timeout=40, stop_after=None if past_timeout else 1.0)
    how = "partition past the heartbeat timeout" if past_timeout else "short partition"
    return _judge(how, hosts, transport, victim, at, reports, survive=not past_timeout)


def loss_delay_round(
    rng: random.Random, loss: float = 0.02, delay_s: float = 0.02, hosts: int = 3
) -> dict:
    """Runs a job for 5 s while every host's outgoing packets are dropped with probability
    ``loss`` and the rest delayed ``delay_s``: by ``tc netem`` on each host's eth0, or, on a
    kernel without sch_netem, by a relay in user space (bench/impaired_link.py). The job must
    go on with every result right. Returns the judged round ("by" says which did it)."""
    from .fault_soak import _judge

    transport, seed = rng.choice(TRANSPORTS), rng.getrandbits(32)
    how = f"loss {loss:.0%} delay {delay_s * 1e3:g}ms"
    with NetnsCluster(hosts, 1, master_port=29500 + rng.randrange(1000)) as cluster:
        by = "netem" if not netem_missing(cluster) else "user-space relay (no sch_netem here)"
        missing = relay_missing() if by != "netem" else ""
        if missing:
            return {"fault": how, "skipped": missing, "problems": []}
        job = start_job(hosts, transport, seed, env=_ENV, cluster=cluster)
        at = time.monotonic()
        if by == "netem":
            for h in range(hosts):
                cluster.shape(h, "none", f"loss {loss * 100:g}% delay {delay_s * 1e3:g}ms")
            reports = finish(job, timeout=60, stop_after=5.0)
            counts = None
        else:
            with ImpairedLinks(cluster, range(hosts), loss, delay_s, seed=seed) as links:
                reports = finish(job, timeout=60, stop_after=5.0)
            counts = links.counts
    result = _judge(how, hosts, transport, -1, at, reports, survive=True)
    result["by"] = by
    if counts is not None:
        result["frames"] = counts
    return result
