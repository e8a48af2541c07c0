"""Compressed all-reduce (``compress="bf16"``/``"fp16"``): 16-bit values on network links,
float32 accumulation, results within the 16-bit rounding bound of the exact sum (numpy, in
float64) and identical on every rank, under every algorithm that runs over network links."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from multiproc import run_ranks

# Unit roundoff of each format (half its machine epsilon).
ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


def _inputs(rank: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    # Mixed magnitudes, so rounding matters at every element, and fp16's range is respected.
    return (rng.standard_normal(count) * rng.choice([0.01, 1.0, 100.0], count)).astype(np.float32)


def _representable(y: np.ndarray, fmt: str) -> bool:
    if fmt == "bf16":
        return bool(np.all(y.view(np.uint32) & 0xFFFF == 0))
    return bool(np.array_equal(y.astype(np.float16).astype(np.float32), y))


def _check_compressed(rank, n, algo, fmt, count, op):
    """Runs one compressed all-reduce, checks it against numpy; returns its digest."""
    import pycollective as pc

    x = _inputs(rank, count)
    y = pc.allreduce(x, op=op, algo=algo, compress=fmt)
    assert y.dtype == np.float32 and y.shape == x.shape
    everyone = np.stack([_inputs(r, count).astype(np.float64) for r in range(n)])
    exact = everyone.sum(axis=0) / (n if op == "avg" else 1)
    magnitude = np.abs(everyone).sum(axis=0) / (n if op == "avg" else 1)
    # Each partial sum is rounded at most once per hop, the result once more.
    bound = (n + 2) * ROUNDOFF[fmt] * magnitude + 1e-30
    err = np.abs(y.astype(np.float64) - exact)
    where = f"{algo} {fmt} {op} of {count}"
    assert np.all(err <= bound), f"{where}: worst error {float((err / bound).max()):.2f}x the bound"
    if op == "sum":
        assert _representable(y, fmt), f"{where}: the result is not rounded to the wire format"
    return hashlib.sha256(y.tobytes()).hexdigest()


# (algo, format, elements, op). 300,007 elements take the pipelined paths; 1,001 take
# halving-doubling's whole-vector exchanges (with 3 ranks, after its fold).
TCP_CASES = [
    ("ring", "bf16", 300_007, "sum"),
    ("halving_doubling", "fp16", 300_007, "avg"),
    ("halving_doubling", "bf16", 1_001, "sum"),
    ("reduce_to_one", "bf16", 5_000, "sum"),
    ("auto", "fp16", 70_001, "sum"),
]


def _over_tcp(rank, n):
    """Every case, then calls compress must refuse (nothing moves), then ranks that disagree
    on compress (which fails the group, so it comes last)."""
    import pycollective as pc

    pc.init(transport="tcp")
    try:
        digests = [_check_compressed(rank, n, *case) for case in TCP_CASES]
        probe = float(pc.allreduce(_wire_probe(rank), algo="ring", compress="bf16")[0])
        refusals = []
        for kwargs in (
            {"x": np.ones(8, np.float64), "compress": "bf16"},
            {"x": np.ones(8, np.float32), "compress": "int8"},
        ):
            try:
                pc.allreduce(**kwargs)
                refusals.append("accepted")
            except (ValueError, pc.CollectiveError) as exc:
                refusals.append(str(exc))
        try:
            pc.allreduce(np.ones(4096, np.float32), compress="bf16" if rank == 0 else None)
            mismatch = "no error"
        except pc.CollectiveError as exc:
            mismatch = str(exc)
        return digests, refusals, mismatch, probe
    finally:
        pc.shutdown()


def _wire_probe(rank: int) -> np.ndarray:
    """Inputs whose compressed sum tells whether they crossed the wire as bfloat16. Sent as
    bf16, 1 + 3*2^-9 arrives as 1 + 2^-7 and the sum with -2^-9 rounds to 1 + 2^-7; summed in
    float32 and rounded once at the end (links in memory), 1 + 2^-8 rounds to even: 1.0."""
    return np.array([[1 + 3 * 2.0**-9, -(2.0**-9)][rank] if rank < 2 else 0.0], np.float32)


BF16_ON_THE_WIRE = 1 + 2.0**-7


def test_compressed_allreduce_over_tcp():
    results = run_ranks(_over_tcp, 3, timeout=90)
    assert {r[3] for r in results} == {BF16_ON_THE_WIRE}, "tcp payloads were not bf16"
    for i, case in enumerate(TCP_CASES):
        assert len({digests[i] for digests, _, _, _ in results}) == 1, f"{case}: ranks disagree"
    for _, (float64, unknown), mismatch, _ in results:
        assert "float64" in float64 and "drop compress=" in float64, float64
        assert "'bf16' or 'fp16'" in unknown, unknown
        assert "compress" in mismatch, mismatch


def _hierarchical(rank, n):
    import pycollective as pc

    pc.init()
    try:
        digest = _check_compressed(rank, n, "hierarchical", "bf16", 200_003, "sum")
        # Ranks 0 and 1 share a host: between them the sum stays in float32, rounded once at
        # the end (every rank calls new_group; ranks 2 and 3 get None).
        host_a = pc.new_group([0, 1])
        if host_a is None:
            return digest, None
        probe = pc.allreduce(_wire_probe(rank), algo="ring", compress="bf16", group=host_a)
        return digest, float(probe[0])
    finally:
        pc.shutdown()


def test_compressed_hierarchical_two_hosts_of_two():
    """Shared memory inside each host (float32), tcp between them (bf16)."""
    hosts = [{"PYCOLLECTIVE_HOST_ID": h} for h in ("a", "a", "b", "b")]
    results = run_ranks(_hierarchical, 4, per_rank_env=hosts, timeout=60)
    assert len({digest for digest, _ in results}) == 1, "ranks ended with different results"
    probes = [probe for _, probe in results]
    assert probes == [1.0, 1.0, None, None], "shared-memory links compressed their data"


def _bf16_by_numpy(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the upper 16 bits (what bfloat16 keeps), in numpy."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_round_to_wire_matches_numpy_and_error_feedback_keeps_the_rest():
    import pycollective as pc

    x = _inputs(0, 10_001)
    assert np.array_equal(pc.round_to_wire(x.copy(), "bf16"), _bf16_by_numpy(x))
    assert np.array_equal(
        pc.round_to_wire(x.copy(), "fp16"), x.astype(np.float16).astype(np.float32)
    )
    feedback = pc.ErrorFeedback("bf16")
    g = x.copy()
    feedback.add_residue("g", g)  # first step: nothing to add yet
    assert np.array_equal(g, x)
    residue = g - _bf16_by_numpy(g)
    g2 = x.copy()
    feedback.add_residue("g", g2)  # second step: last step's residue is added
    assert np.allclose(g2, x + residue, rtol=0, atol=1e-6)
    # A refused array changes nothing: neither itself nor the residue the next step adds.
    wrong = x.astype(np.float64)
    with pytest.raises(ValueError, match="float32"):
        feedback.add_residue("g", wrong)
    assert np.array_equal(wrong, x.astype(np.float64))
    g3 = x.copy()
    residue2 = g2 - _bf16_by_numpy(g2)
    feedback.add_residue("g", g3)
    assert np.allclose(g3, x + residue2, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="float32"):
        pc.round_to_wire(np.ones(4), "bf16")
