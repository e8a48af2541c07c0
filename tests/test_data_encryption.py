"""Encrypted tcp data links (PYCOLLECTIVE_DATA_ENCRYPT=1): collectives give exact results over
AES-256-GCM records, and ranks that disagree on encryption refuse each other with a reason. What
happens to altered, replayed, reordered or cut records is tests/native/test_tcp.cc's job (it
relays the bytes between two links)."""

from __future__ import annotations

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
