"""Encrypted tcp data links (PYCOLLECTIVE_DATA_ENCRYPT=1): collectives give exact results over
AES-256-GCM records, and ranks that disagree on encryption refuse each other with a reason. What
happens to altered, replayed, reordered or cut records is tests/native/test_tcp.cc's job (it
relays the bytes between two links)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from multiproc import run_ranks

ENCRYPTED = {"PYCOLLECTIVE_TRANSPORT": "tcp", "PYCOLLECTIVE_DATA_ENCRYPT": "1"}


def _collectives(rank, n):
    import pycollective as pc
    from pycollective import _C

    pc.init()
    worst = 0.0
    for count in (0, 1, 7, 16411, (1 << 20) + 3):
        base = np.arange(count, dtype=np.float64) % 1009
        for algo in ("ring", "halving_doubling", "reduce_to_one"):
            y = pc.allreduce(base * (rank + 1), algo=algo)
            worst = max(worst, float(np.abs(y - base * (n * (n + 1) / 2)).max(initial=0)))
        gathered = pc.allgather(base[: count // 3] + rank)
        expected = np.concatenate([base[: count // 3] + r for r in range(n)])
        worst = max(worst, float(np.abs(np.ravel(gathered) - expected).max(initial=0)))
    pc.barrier()
    return [worst, _C.data_cipher_library()]


@pytest.mark.timeout(150)
def test_collectives_over_encrypted_links_are_exact():
    for worst, library in run_ranks(_collectives, 3, timeout=120, env=ENCRYPTED):
        assert worst == 0.0
        assert "libcrypto" in library


def _joins(rank, n):
    import pycollective as pc

    try:
        pc.init(connect_timeout=5)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return [type(exc).__name__, str(exc)]
    return ["joined", ""]


@pytest.mark.timeout(90)
def test_ranks_that_disagree_on_encryption_refuse_each_other():
    res = run_ranks(
        _joins, 2, timeout=60, env=ENCRYPTED, per_rank_env=[{}, {"PYCOLLECTIVE_DATA_ENCRYPT": "0"}]
    )
    assert res[1][0] != "joined" and "PYCOLLECTIVE_DATA_ENCRYPT" in res[1][1], res[1]
    assert res[0][0] != "joined", res[0]


def _channel_pair(monkeypatch, listener_encrypts: str, client_encrypts: str):
    """A ChannelListener and a connect() in this process, each under its own setting."""
    from pycollective import channel, config

    monkeypatch.setenv("PYCOLLECTIVE_DATA_ENCRYPT", listener_encrypts)
    config.reload()
    listener = channel.ChannelListener("tok", "enc-test", "127.0.0.1", timeout=20)
    accepted: list = []

    def accept() -> None:
        try:
            accepted.append(listener.accept(timeout=10))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            accepted.append(exc)

    thread = threading.Thread(target=accept)
    thread.start()
    monkeypatch.setenv("PYCOLLECTIVE_DATA_ENCRYPT", client_encrypts)
    config.reload()
    try:
        client = channel.connect(f"127.0.0.1:{listener.port}", "tok", "enc-test", timeout=10)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        client = exc
    thread.join(20)
    listener.close()
    monkeypatch.delenv("PYCOLLECTIVE_DATA_ENCRYPT")
    config.reload()
    return accepted[0], client


@pytest.mark.timeout(60)
def test_parameter_server_data_channels_are_encrypted_on_request(monkeypatch):
    """The ps data plane's channels (pycollective.channel) use the same handshake and records:
    a tensor crosses an encrypted channel exact, and ends that disagree refuse each other."""
    server, client = _channel_pair(monkeypatch, "1", "1")
    data = np.arange(300_001, dtype=np.float32)
    received = np.empty_like(data)
    sender = threading.Thread(target=client.send, args=(data,))
    sender.start()
    server.recv(received)
    sender.join(20)
    np.testing.assert_array_equal(received, data)
    client.close("done")
    server.close("done")

    server, client = _channel_pair(monkeypatch, "1", "0")
    assert isinstance(client, Exception) and "PYCOLLECTIVE_DATA_ENCRYPT" in str(client), client
