"""Kubeflow's TFJob and PyTorchJob, as far as a machine without Kubernetes can take them: the
manifests docs/launching.md shows (examples/kubernetes/), the environment the training operator
derives from them for each pod, fed to ``pc.init()`` as it is, checked field by field and then
run for real: one process per pod on this host, the pods' service names resolved to loopback by
a test hook (the one thing Kubernetes' DNS would do), an all-reduce checked against numpy.

The operator's rules, from kubeflow/training-operator, pkg/controller.v1:
- tensorflow/tensorflow.go (genTFConfigJSONStr, genClusterSpec): TF_CONFIG = {"cluster": {type:
  ["<job>-<type>-<i>.<namespace>.svc:<tfjob-port>", ...]}, "task": {"type", "index"},
  "environment": "cloud"}, evaluators left out of the cluster;
- pytorch/master.go, pytorch/envvar.go: MASTER_ADDR "<job>-master-0", MASTER_PORT the master
  container's "pytorchjob-port", WORLD_SIZE = replicas x nprocPerNode (1 unless a number is
  given), RANK 0 for the master and index + 1 for a worker; newer operators add PET_MASTER_ADDR,
  PET_MASTER_PORT, PET_NPROC_PER_NODE, PET_NODE_RANK and PET_NNODES (torchrun's).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from multiproc import reserve_ports, run_ranks

from pycollective.rendezvous import ClusterSpec

yaml = pytest.importorskip("yaml", reason="the manifests are YAML (pip install pyyaml)")

pytestmark = pytest.mark.timeout(90)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = os.path.join(ROOT, "examples", "kubernetes")
TOKEN = "k8s-secret-token"  # what the Secret "pycollective-token" would hold


def manifest(name: str) -> dict:
    with open(os.path.join(MANIFESTS, name)) as f:
        return yaml.safe_load(f)


def _container(replica: dict, name: str) -> dict:
    (container,) = [c for c in replica["template"]["spec"]["containers"] if c["name"] == name]
    return container


def _port(container: dict, port_name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == port_name]
    return port


def tfjob_pods(job: dict, port: int | None = None) -> list[dict[str, str]]:
    """Every pod's TF_CONFIG (as the operator writes it), chief and workers in rank order."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    specs = job["spec"]["tfReplicaSpecs"]
    cluster: dict[str, list[str]] = {}
    for rtype, replica in specs.items():
        if rtype == "Evaluator":
            continue
        p = port or _port(_container(replica, "tensorflow"), "tfjob-port")
        rt = rtype.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{p}" for i in range(replica["replicas"])]
    pods = []
    for rt in ("chief", "worker"):
        for index in range(len(cluster.get(rt, []))):
            config = {"cluster": cluster, "task": {"type": rt, "index": index}}
            pods.append({"TF_CONFIG": json.dumps({**config, "environment": "cloud"})})
    return pods


def pytorchjob_pods(job: dict, port: int | None = None) -> list[dict[str, str]]:
    """Every pod's variables (as the operator sets them), the master first."""
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    master_port = port or _port(_container(specs["Master"], "pytorch"), "pytorchjob-port")
    world = sum(r["replicas"] for r in specs.values())
    pods = []
    for rank in range(world):
        pods.append(
            {
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": str(master_port),
                "PET_MASTER_ADDR": f"{name}-master-0",
                "PET_MASTER_PORT": str(master_port),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "PET_NPROC_PER_NODE": "auto",
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(world),
                "PYTHONUNBUFFERED": "0",
            }
        )
    return pods


def _secret(container: dict) -> dict[str, str]:
    """The token variable the manifest mounts from the Secret."""
    (var,) = [e for e in container["env"] if e["name"] == "PYCOLLECTIVE_TOKEN"]
    assert var["valueFrom"]["secretKeyRef"] == {"name": "pycollective-token", "key": "token"}
    return {"PYCOLLECTIVE_TOKEN": TOKEN}


@pytest.mark.parametrize("name", ["tfjob_digits.yaml", "pytorchjob_digits.yaml"])
def test_manifests_are_the_ones_the_docs_show_and_run_the_digits_example(name):
    with open(os.path.join(MANIFESTS, name)) as f:
        text = f.read()
    with open(os.path.join(ROOT, "docs", "launching.md")) as f:
        assert text in f.read(), f"docs/launching.md does not show examples/kubernetes/{name}"
    job = manifest(name)
    for replica in next(v for k, v in job["spec"].items() if k.endswith("ReplicaSpecs")).values():
        (container,) = replica["template"]["spec"]["containers"]
        script = os.path.join(ROOT, container["command"][1])
        assert os.path.exists(script) and "--multi-worker" in container["command"]
        _secret(container)


def test_tfjob_environment():
    job = manifest("tfjob_digits.yaml")
    token = _secret(_container(job["spec"]["tfReplicaSpecs"]["Worker"], "tensorflow"))
    pods = tfjob_pods(job)
    assert len(pods) == 2
    for rank, pod in enumerate(pods):
        s = ClusterSpec.from_env({**pod, **token})
        assert (s.rank, s.world_size, s.local_rank, s.local_size) == (rank, 2, 0, 1)
        assert s.master == "digits-worker-0.default.svc:2222" and s.token == TOKEN
        assert s.source.startswith("TF_CONFIG")


def test_tfjob_environment_with_a_chief_and_an_evaluator():
    job = manifest("tfjob_digits.yaml")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    job["spec"]["tfReplicaSpecs"] = {
        "Chief": {**worker, "replicas": 1},
        "Worker": worker,
        "Evaluator": {**worker, "replicas": 1},
    }
    ranks = [ClusterSpec.from_env({**pod, "PYCOLLECTIVE_TOKEN": TOKEN}) for pod in tfjob_pods(job)]
    assert [(s.rank, s.world_size) for s in ranks] == [(0, 3), (1, 3), (2, 3)]
    assert {s.master for s in ranks} == {"digits-chief-0.default.svc:2222"}


def test_pytorchjob_environment():
    job = manifest("pytorchjob_digits.yaml")
    token = _secret(_container(job["spec"]["pytorchReplicaSpecs"]["Master"], "pytorch"))
    pods = pytorchjob_pods(job)
    assert len(pods) == 2
    for rank, pod in enumerate(pods):
        s = ClusterSpec.from_env({**pod, **token})
        assert (s.rank, s.world_size) == (rank, 2)
        assert (s.local_rank, s.local_size) == (None, None)  # from the peers' host ids
        # torch.distributed owns MASTER_PORT; the coordinator takes the next port.
        assert s.master == "digits-master-0:23457" and s.token == TOKEN


def _allreduce_in_pod(rank, world, pod_env):
    """One pod: the operator's variables and the Secret's token, nothing of the harness's."""
    import pycollective as pc
    from pycollective.rendezvous import bootstrap
    from pycollective.rendezvous.cluster import parse_address

    for name in [n for n in os.environ if n.startswith("PYCOLLECTIVE_")]:
        if name not in ("PYCOLLECTIVE_TIMEOUT", "PYCOLLECTIVE_CONNECT_TIMEOUT"):
            del os.environ[name]
    os.environ.update(pod_env[rank])
    os.environ["PYCOLLECTIVE_TOKEN"] = TOKEN

    # Kubernetes' DNS resolves a pod's service name to the pod; here every pod is this host
    # (for Python's resolver, which picks the address each server binds, and for gRPC's).
    import socket

    resolve = socket.getaddrinfo

    def pods_are_here(host, *args, **kwargs):
        return resolve("127.0.0.1" if str(host).startswith("digits-") else host, *args, **kwargs)

    socket.getaddrinfo = pods_are_here
    connect = bootstrap.CoordinationClient

    def via_loopback(address, *args, **kwargs):
        host, service_port = parse_address(address)
        if host.startswith("digits-"):
            address = f"127.0.0.1:{service_port}"
        return connect(address, *args, **kwargs)

    bootstrap.CoordinationClient = via_loopback

    pc.init()
    x = np.arange(1009, dtype=np.float32) * (rank + 1)
    got = pc.allreduce(x)
    expected = np.arange(1009, dtype=np.float32) * sum(range(1, world + 1))
    result = {
        "rank": pc.rank(),
        "world": pc.world_size(),
        "ok": bool(np.array_equal(got, expected)),
    }
    pc.shutdown()
    return result


@pytest.mark.parametrize("operator", ["tfjob", "pytorchjob"])
def test_operator_environment_forms_a_group(operator):
    with reserve_ports(1) as reserved:  # the coordinator's port, held until rank 0 listens
        port = reserved.ports[0]
        if operator == "tfjob":  # as if the manifest's tfjob-port were this free port
            pods = tfjob_pods(manifest("tfjob_digits.yaml"), port)
        else:  # the coordinator listens on MASTER_PORT + 1
            pods = pytorchjob_pods(manifest("pytorchjob_digits.yaml"), port - 1)
        results = run_ranks(_allreduce_in_pod, len(pods), pods)
    assert [r["rank"] for r in results] == list(range(len(pods)))
    assert all(r["world"] == len(pods) and r["ok"] for r in results), results
