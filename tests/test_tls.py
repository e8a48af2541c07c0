"""Mutual TLS on the gRPC control plane (PYCOLLECTIVE_TLS_*, `pycollective run --tls-*`): a job
runs with it, and the coordinator refuses every client that does not present a certificate of the
cluster's CA, before any handler runs."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
from multiproc import run_ranks

pytest.importorskip("cryptography", reason="the test extra's `cryptography` makes the test CAs")
from tls_certs import Authority  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The cluster's CA with one certificate for the job, and a stranger's CA with one of its
    own."""
    folder = str(tmp_path_factory.mktemp("pki"))
    cluster, stranger = Authority(folder, "cluster"), Authority(folder, "stranger")
    return {"job": cluster.issue("job"), "stranger": stranger.issue("intruder")}


def _allreduce(rank, n):
    import pycollective as pc

    pc.init()
    x = np.arange(1000, dtype=np.float32) * (rank + 1)
    y = pc.allreduce(x, algo="ring")
    pc.barrier()
    return float(np.abs(y - np.arange(1000, dtype=np.float32) * (n * (n + 1) / 2)).max())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_a_job_runs_over_mutual_tls(pki, transport):
    env = {**pki["job"].env(), "PYCOLLECTIVE_TRANSPORT": transport}
    assert run_ranks(_allreduce, 3, timeout=90, env=env) == [0.0] * 3


def _joins(rank, n):
    import pycollective as pc

    try:
        pc.init(connect_timeout=4)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return [type(exc).__name__, str(exc)]
    return ["joined", ""]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("intruder", ["no certificate", "another CA's certificate"])
def test_a_rank_without_the_clusters_certificate_cannot_join(pki, intruder):
    env = pki["job"].env()
    if intruder == "no certificate":
        other = {k: "" for k in env}
    else:
        other = pki["stranger"].env()
    res = run_ranks(_joins, 2, timeout=60, env=env, per_rank_env=[{}, other])
    assert res[1][0] != "joined", res
    assert "could not reach the coordinator" in res[1][1], res[1]
    if intruder != "no certificate":
        assert "same CA" in res[1][1], res[1]  # the hint names TLS when TLS is on
    assert res[0][0] != "joined", res[0]  # rank 0 waited for a rank that never registered


@pytest.fixture
def tls_service(pki, monkeypatch):
    """A 1-rank coordination service on 127.0.0.1 behind mutual TLS."""
    from pycollective import config
    from pycollective.rendezvous import CoordinationService

    for key, value in pki["job"].env().items():
        monkeypatch.setenv(key, value)
    config.reload()
    service = CoordinationService(1, "tok", host="127.0.0.1")
    service.start()
    yield service
    service.stop(grace=0)
    monkeypatch.undo()
    config.reload()


def _register(address: str, credentials) -> str:
    """Registers rank 0 over a channel made with ``credentials`` (None: plaintext); returns
    "registered" or the gRPC status name."""
    from pycollective.rendezvous import coordination_pb2 as pb
    from pycollective.rendezvous import coordination_pb2_grpc as pb_grpc

    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    try:
        pb_grpc.CoordinationStub(channel).Register(
            pb.RegisterRequest(rank=0, host_id="h", pid=os.getpid()),
            timeout=3,
            metadata=(("x-pycollective-token", "tok"),),
        )
        return "registered"
    except grpc.RpcError as exc:
        return exc.code().name
    finally:
        channel.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.timeout(60)
def test_the_coordinator_refuses_clients_without_a_certificate_of_its_ca(pki, tls_service):
    job, stranger = pki["job"], pki["stranger"]
    ca = _read(job.ca)
    attempts = {
        "plaintext": None,
        "TLS without a client certificate": grpc.ssl_channel_credentials(root_certificates=ca),
        "another CA's client certificate": grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=_read(stranger.key),
            certificate_chain=_read(stranger.cert),
        ),
    }
    for what, credentials in attempts.items():
        assert _register(tls_service.address, credentials) == "UNAVAILABLE", what
    assert tls_service._state.peers == {}  # nobody got as far as a handler
    trusted = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=_read(job.key), certificate_chain=_read(job.cert)
    )
    assert _register(tls_service.address, trusted) == "registered"


@pytest.mark.timeout(30)
def test_tls_needs_all_three_files(monkeypatch, pki):
    from pycollective import config
    from pycollective.rendezvous import tls

    monkeypatch.setenv("PYCOLLECTIVE_TLS_CERT", pki["job"].cert)
    config.reload()
    try:
        with pytest.raises(ValueError, match="PYCOLLECTIVE_TLS_KEY, PYCOLLECTIVE_TLS_CA are"):
            tls.configured()
    finally:
        monkeypatch.undo()
        config.reload()


@pytest.mark.timeout(90)
def test_launcher_tls_flags(pki, tmp_path):
    """`pycollective run --tls-cert/--tls-key/--tls-ca` hands the files to every rank."""
    job = pki["job"]
    script = tmp_path / "job.py"
    script.write_text(
        "import numpy as np, pycollective as pc\n"
        "from pycollective.rendezvous import tls\n"
        "pc.init()\n"
        "assert tls.configured() is not None\n"
        "print('sum', pc.allreduce(np.ones(4))[0], flush=True)\n"
        "pc.shutdown()\n"
    )
    base = [sys.executable, "-m", "pycollective.cli", "run", "-n", "2", "--timeout", "60"]
    flags = ["--tls-cert", job.cert, "--tls-key", job.key, "--tls-ca", job.ca]
    done = subprocess.run(
        [*base, *flags, sys.executable, str(script)], capture_output=True, text=True, timeout=80
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("sum 2.0") == 2, done.stdout
    half = subprocess.run(
        [*base, *flags[:2], sys.executable, str(script)], capture_output=True, text=True, timeout=30
    )
    assert half.returncode == 2 and "all three" in half.stderr, half.stderr


@pytest.mark.timeout(60)
def test_parameter_server_tasks_serve_over_mutual_tls(pki, monkeypatch):
    """A ps task behind TLS answers a client with the cluster's certificate (its handler runs:
    the unknown key is its error) and refuses a plaintext one."""
    from pycollective import config
    from pycollective.rendezvous import tls
    from pycollective.strategies import Server
    from pycollective.strategies.parameter_server import ps_pb2 as pb
    from pycollective.strategies.parameter_server import ps_pb2_grpc as pb_grpc
    from pycollective.strategies.parameter_server import wire

    for key, value in pki["job"].env().items():
        monkeypatch.setenv(key, value)
    config.reload()
    server = Server({"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:0"]}, "ps", 0, token="t")
    try:
        codes = {}
        for what, channel in (
            ("tls", tls.channel(server.address)),
            ("plaintext", grpc.insecure_channel(server.address)),
        ):
            try:
                pb_grpc.ParameterServerStub(channel).Pull(
                    pb.PullRequest(keys=["no-such-variable"]),
                    timeout=3,
                    metadata=wire.metadata("t"),
                )
                codes[what] = "OK"
            except grpc.RpcError as exc:
                codes[what] = exc.code().name
            finally:
                channel.close()
        assert codes["plaintext"] == "UNAVAILABLE", codes
        assert codes["tls"] not in ("UNAVAILABLE", "UNAUTHENTICATED"), codes
    finally:
        server.stop(0)
        monkeypatch.undo()
        config.reload()
