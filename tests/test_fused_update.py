"""pycollective.fused_update against numpy: the in-process reduce-and-update kernels, and the
update fused into an all-reduce across processes (allreduce_apply)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from multiproc import run_ranks

from pycollective import fused_update as fu

# More than one 512 KiB piece and an odd tail, so pieces and blocks split the work.
COUNTS = [1, 1000, 3 * (512 * 1024 // 4) + 17]


def reference(rule, hyper, grads, w, slots):
    """The rule in float64 numpy (csrc/optim/replicated_update.h)."""
    g = hyper.grad_scale * np.sum([x.astype(np.float64) for x in grads], axis=0)
    w = w.astype(np.float64)
    s = [x.astype(np.float64) for x in slots]
    if rule == "sgd":
        return w - hyper.lr * g, []
    if rule in ("momentum", "nesterov"):
        m = hyper.momentum * s[0] - hyper.lr * g
        w = w + m if rule == "momentum" else w + hyper.momentum * m - hyper.lr * g
        return w, [m]
    m = s[0] + (g - s[0]) * (1 - hyper.beta_1)
    v = s[1] + (g * g - s[1]) * (1 - hyper.beta_2)
    return w - hyper.lr * m / (np.sqrt(v) + hyper.epsilon), [m, v]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", list(fu.RULES))
@pytest.mark.parametrize("replicas,copies", [(1, 1), (3, 3), (1, 2), (4, 1)])
def test_rule_matches_numpy(rule, dtype, count, replicas, copies):
    rng = np.random.default_rng(count + replicas)
    hyper = fu.Hyper(
        lr=0.05, momentum=0.9, beta_1=0.9, beta_2=0.999, epsilon=1e-7, grad_scale=1.0 / replicas
    )
    grads = [rng.standard_normal(count).astype(dtype) for _ in range(replicas)]
    w0 = rng.standard_normal(count).astype(dtype)
    slot0 = [np.abs(rng.standard_normal(count)).astype(dtype) for _ in fu.RULES[rule][1]]
    var_copies = [w0.copy() for _ in range(copies)]
    slot_copies = [[s.copy() for _ in range(copies)] for s in slot0]
    fu.apply(rule, hyper, [fu.ReplicatedTensor(grads, var_copies, slot_copies)])
    want_w, want_slots = reference(rule, hyper, grads, w0, slot0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for c in var_copies:
        np.testing.assert_allclose(c, want_w, **tol)
        np.testing.assert_array_equal(c, var_copies[0])
    for got, want in zip(slot_copies, want_slots):
        for c in got:
            np.testing.assert_allclose(c, want, **tol)


def test_many_tensors_in_one_call():
    rng = np.random.default_rng(1)
    shapes = [(3,), (200, 7), (1,), (70_000,)]
    grads = [[rng.standard_normal(s).astype(np.float32) for _ in range(2)] for s in shapes]
    copies = [[np.ones(s, np.float32) for _ in range(2)] for s in shapes]
    fu.apply(
        "sgd",
        fu.Hyper(lr=0.5, grad_scale=0.5),
        [fu.ReplicatedTensor(g, c) for g, c in zip(grads, copies)],
    )
    for g, c in zip(grads, copies):
        np.testing.assert_allclose(c[1], 1 - 0.5 * (g[0] + g[1]) / 2, rtol=1e-6, atol=1e-6)


def test_supported_says_when_the_native_path_applies():
    a = np.zeros(8, np.float32)
    assert fu.supported([fu.ReplicatedTensor([a.copy()], [a])])
    assert not fu.supported([fu.ReplicatedTensor([a.astype(np.float16)], [a.astype(np.float16)])])
    assert not fu.supported([fu.ReplicatedTensor([np.zeros(16, np.float32)[::2]], [a])])
    assert not fu.supported([fu.ReplicatedTensor([a.copy()], [a[::-1]])])  # not contiguous
    readonly = a.copy()
    readonly.flags.writeable = False
    assert not fu.supported([fu.ReplicatedTensor([a.copy()], [readonly])])
    assert not fu.supported([fu.ReplicatedTensor([np.zeros(7, np.float32)], [a])])  # shape
    assert not fu.supported([fu.ReplicatedTensor([a.astype(np.float64)], [a])])  # dtype
    assert not fu.supported([fu.ReplicatedTensor([], [a])])
    misaligned = np.zeros(8 * 4 + 1, np.uint8)[1:].view(np.float32)
    assert not fu.supported([fu.ReplicatedTensor([a.copy()], [misaligned])])


def test_bad_calls_say_what_is_wrong():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="unknown update rule 'lamb'"):
        fu.apply("lamb", fu.Hyper(lr=1), [fu.ReplicatedTensor([a.copy()], [a])])
    with pytest.raises(ValueError, match=r"keeps slots \('m', 'v'\), got 1"):
        fu.apply("adam", fu.Hyper(lr=1), [fu.ReplicatedTensor([a.copy()], [a], [[a.copy()]])])
    with pytest.raises(TypeError, match="float32/float64"):
        h = a.astype(np.float16)
        fu.apply("sgd", fu.Hyper(lr=1), [fu.ReplicatedTensor([h.copy()], [h])])
    with pytest.raises(TypeError, match="one dtype per call"):  # check=False keeps this check
        fu.apply(
            "sgd",
            fu.Hyper(lr=1),
            [
                fu.ReplicatedTensor([a.copy()], [a]),
                fu.ReplicatedTensor([a.astype(np.float64)], [a.astype(np.float64)]),
            ],
            check=False,
        )
    with pytest.raises(TypeError, match="one dtype per call"):
        fu.apply(
            "sgd",
            fu.Hyper(lr=1),
            [
                fu.ReplicatedTensor([a.copy()], [a]),
                fu.ReplicatedTensor([a.astype(np.float64)], [a.astype(np.float64)]),
            ],
        )


_BITS_SCRIPT = """
import hashlib
import numpy as np
from pycollective import fused_update as fu
h = hashlib.sha256()
for rule in fu.RULES:
    for dtype in (np.float32, np.float64):
        rng = np.random.default_rng(7)
        count = 100_003
        grads = [rng.standard_normal(count).astype(dtype) for _ in range(2)]
        w = rng.standard_normal(count).astype(dtype)
        slots = [[np.abs(rng.standard_normal(count)).astype(dtype)] for _ in fu.RULES[rule][1]]
        fu.apply(rule, fu.Hyper(lr=0.01, momentum=0.9, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                                grad_scale=0.5), [fu.ReplicatedTensor(grads, [w], slots)])
        for a in [w] + [s[0] for s in slots]:
            h.update(a.tobytes())
import pycollective
print(pycollective.build_info()["simd"], h.hexdigest())
"""


def test_every_instruction_set_computes_the_same_bits():
    """Replicas on CPUs of different SIMD levels must stay bitwise identical: the update kernels
    are built without FMA contraction (csrc/CMakeLists.txt)."""
    digests = {}
    for level in ("generic", "avx2", "avx512"):
        env = dict(os.environ, PYCOLLECTIVE_SIMD=level)
        out = subprocess.run(
            [sys.executable, "-c", _BITS_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        used, digest = out.stdout.split()
        digests[used] = digest  # a level this CPU lacks falls back to one it has
    if len(digests) < 2:
        pytest.skip(f"this CPU runs only the {next(iter(digests))} kernels")
    assert len(set(digests.values())) == 1, digests


# Across processes: fused_update.allreduce_apply ------------------------------------------------

# Empty, fewer elements than ranks, one ring segment with an odd tail, several segments.
ACROSS_COUNTS = [0, 2, 1001, 3 * (256 * 1024 // 4) + 5]


def _allreduce_apply_ranks(rank, n, transport, sharded):
    import pycollective as pc

    pc.init(transport=transport)
    checks = 0
    for rule in fu.RULES:
        for dtype in (np.float32, np.float64):
            hyper = fu.Hyper(
                lr=0.05, momentum=0.9, beta_1=0.9, beta_2=0.999, epsilon=1e-7, grad_scale=1.0 / n
            )
            rng = np.random.default_rng(len(rule))  # every rank draws the same numbers
            grads = [
                [rng.standard_normal(c).astype(dtype) for c in ACROSS_COUNTS] for _ in range(n)
            ]
            w0 = [rng.standard_normal(c).astype(dtype) for c in ACROSS_COUNTS]
            s0 = [
                [np.abs(rng.standard_normal(c)).astype(dtype) for c in ACROSS_COUNTS]
                for _ in fu.RULES[rule][1]
            ]
            copies = 1 + len(rule) % 2  # one copy for some rules, two for others
            var_copies = [[w.copy() for _ in range(copies)] for w in w0]
            # Sharded (ZeRO-1): one array per slot, this rank's chunk of it.
            bounds = [fu.shard_bounds(c, n, rank) if sharded else (0, c) for c in ACROSS_COUNTS]
            slot_copies = [
                [
                    [s[i][slice(*bounds[i])].copy() for _ in range(1 if sharded else copies)]
                    for s in s0
                ]
                for i in range(len(ACROSS_COUNTS))
            ]
            fu.allreduce_apply(
                rule,
                hyper,
                [
                    fu.ReplicatedTensor([grads[rank][i]], var_copies[i], slot_copies[i])
                    for i in range(len(ACROSS_COUNTS))
                ],
                sharded_slots=sharded,
            )
            tol = (
                dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
            )
            for i in range(len(ACROSS_COUNTS)):
                want_w, want_slots = reference(
                    rule, hyper, [g[i] for g in grads], w0[i], [s[i] for s in s0]
                )
                for c in var_copies[i]:
                    np.testing.assert_allclose(c, want_w, **tol, err_msg=f"{rule} {dtype} {i}")
                    np.testing.assert_array_equal(c, var_copies[i][0])
                for got, want in zip(slot_copies[i], want_slots):
                    for c in got:
                        np.testing.assert_allclose(c, want[slice(*bounds[i])], **tol)
                # Every rank holds the same bits: each chunk was computed once, by its owner.
                shared = [var_copies[i][0]] + ([] if sharded else [s[0] for s in slot_copies[i]])
                state = np.concatenate(shared)
                gathered = np.asarray(pc.allgather(state))
                assert all(gathered[r].tobytes() == state.tobytes() for r in range(n))
                checks += 1
    pc.shutdown()
    return checks


# 4 KiB ring segments: the larger tensors take dozens of segments, so the few segment-sized
# buffers that the sums pass through (ring.cc, SlotRing) are taken again and again, across
# tensors.
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "n,transport,sharded,segment_bytes",
    [
        (2, "shm", False, None),
        (3, "tcp", False, None),
        (2, "shm", True, 4096),
        (3, "shm", True, 4096),
        (4, "tcp", False, 4096),
    ],
)
def test_allreduce_apply_matches_numpy_on_every_rank(n, transport, sharded, segment_bytes):
    env = {"PYCOLLECTIVE_SEGMENT_BYTES": str(segment_bytes)} if segment_bytes else None
    results = run_ranks(_allreduce_apply_ranks, n, transport, sharded, timeout=100, env=env)
    assert results == [len(fu.RULES) * 2 * len(ACROSS_COUNTS)] * n


def _allreduce_apply_bad_calls(rank, n):
    import pycollective as pc

    pc.init()
    a = np.ones(8, np.float32)
    errors = []
    for call in (
        lambda: fu.allreduce_apply(
            "sgd", fu.Hyper(lr=1), [fu.ReplicatedTensor([a.copy(), a.copy()], [a])]
        ),
        lambda: fu.allreduce_apply(
            "sgd",
            fu.Hyper(lr=1),
            [fu.ReplicatedTensor([a.astype(np.float16)], [a.astype(np.float16)])],
        ),
        lambda: fu.allreduce_apply(
            "momentum", fu.Hyper(lr=1), [fu.ReplicatedTensor([a.copy()], [a])]
        ),
        # A bad second tensor is refused before the first one's collective runs.
        lambda: fu.allreduce_apply(
            "momentum",
            fu.Hyper(lr=1),
            [
                fu.ReplicatedTensor([a.copy()], [a], [[a.copy()]]),
                fu.ReplicatedTensor([a.copy()], [a.copy()], [[a.copy(), a.copy()]]),
            ],
        ),
    ):
        try:
            call()
            errors.append(None)
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    # Nothing moved: the group still works.
    total = np.asarray(pc.allreduce(np.full(3, rank + 1.0))).tolist()
    pc.shutdown()
    return errors, total


@pytest.mark.timeout(60)
def test_allreduce_apply_bad_calls_fail_before_anything_moves():
    for errors, total in run_ranks(_allreduce_apply_bad_calls, 2, timeout=40):
        assert "one gradient" in errors[0], errors
        assert "float32/float64" in errors[1], errors
        assert "keeps slots ('momentum',), got 0" in errors[2], errors
        assert "tensor 1 has 1 copies but a slot with 2" in errors[3], errors
        assert total == [3.0, 3.0, 3.0]


def _allreduce_apply_in_a_subgroup(rank, n):
    import pycollective as pc

    pc.init()
    group = pc.new_group([0, 2])
    w = np.full(1000, 10.0, np.float32)
    if group is not None:
        grad = np.full(1000, float(rank + 1), np.float32)  # ranks 0 and 2: 1 and 3
        fu.allreduce_apply(
            "sgd", fu.Hyper(lr=0.5, grad_scale=0.5), [fu.ReplicatedTensor([grad], [w])], group=group
        )
    # The world's own sequence is untouched by the subgroup's collective.
    total = np.asarray(pc.allreduce(np.ones(2, np.float32))).tolist()
    pc.shutdown()
    return float(w[0]), float(w[-1]), total


@pytest.mark.timeout(60)
def test_allreduce_apply_in_a_subgroup():
    results = run_ranks(_allreduce_apply_in_a_subgroup, 3, timeout=40)
    want = 10.0 - 0.5 * 0.5 * (1 + 3)
    assert results[0][:2] == results[2][:2] == [want, want], results
    assert results[1][:2] == [10.0, 10.0], results  # not a member: its array is untouched
    assert all(r[2] == [3.0, 3.0] for r in results), results
