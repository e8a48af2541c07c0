"""Sharded optimizer state (ZeRO stage 1): MultiWorkerMirroredStrategy(shard_optimizer_state=True)
trains like the unsharded strategy, keeps 1/N of the slots per worker, and its checkpoints
restore sharded or not under another number of workers."""

from __future__ import annotations

import numpy as np
import pytest
from multiproc import run_ranks

# Uneven on purpose: 7001 is divisible by neither 2 nor 3, (2,) and (1,) are smaller than 3
# workers (some workers own no element of them).
SHAPES = [(7001,), (40, 3), (5,), (2,), (1,)]


def _optimizer(kind):
    from pycollective import strategies as ds

    if kind == "adam":
        return ds.Adam(0.01)
    return ds.SGD(0.05, momentum=0.9)


def _grads(variables, replica, step):
    """Depends on the variables (so errors compound over the steps) and on the replica."""
    rng = np.random.default_rng(1000 * step + replica)
    return [
        (0.1 * np.asarray(v) + rng.standard_normal(v.shape)).astype(np.float32) for v in variables
    ]


def _train(strategy, kind, steps):
    from pycollective import strategies as ds

    with strategy.scope():
        variables = [
            ds.Variable(np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s))
            for s in SHAPES
        ]
        opt = _optimizer(kind)

    def step_fn(step):
        replica = ds.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients(zip(_grads(variables, replica, step), variables))

    for step in range(steps):
        strategy.run(step_fn, args=(step,))
    return variables, opt


def _parity(kind, local_replicas):
    """50 steps sharded and unsharded in this process (inside a process group), compared."""
    import os

    from pycollective import strategies as ds
    from pycollective.strategies.sharded_state import ShardedSlot, optimizer_state_bytes

    os.environ["PYCOLLECTIVE_CPU_REPLICAS"] = str(local_replicas)  # read by each strategy
    plain_vars, plain_opt = _train(ds.MultiWorkerMirroredStrategy(), kind, 50)
    sharded = ds.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
    shard_vars, shard_opt = _train(sharded, kind, 50)
    os.environ.pop("PYCOLLECTIVE_CPU_REPLICAS")
    slots = [s for _, _, s in shard_opt._slot_order]
    assert slots and all(isinstance(s, ShardedSlot) for s in slots)
    return {
        "max_diff": max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(plain_vars, shard_vars)
        ),
        "params": [np.asarray(v).tolist() for v in shard_vars],
        "local_copies_equal": all(
            np.array_equal(c, v._arrays[0]) for v in shard_vars for c in v._arrays
        ),
        "state_bytes": [optimizer_state_bytes(plain_opt), optimizer_state_bytes(shard_opt)],
        "calls": dict(sharded.extended.backend.call_counts),
        # The whole slot, gathered from the shards, against the unsharded slot.
        "slot_diff": max(
            float(
                np.max(
                    np.abs(
                        shard_opt.get_slot(sv, name).numpy()
                        - np.asarray(plain_opt.get_slot(pv, name))
                    )
                )
            )
            for pv, sv in zip(plain_vars, shard_vars)
            for name in shard_opt.get_slot_names()
        ),
    }


def _refusals():
    """What sharded state cannot do is refused, saying what to do."""
    from pycollective import strategies as ds

    strategy = ds.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
    with strategy.scope():
        half = ds.Variable(np.ones(3, np.float16))
        opt = ds.SGD(0.1, momentum=0.5)
    errors = []
    for call in (
        lambda: opt.apply_gradients([(np.ones(3, np.float16), half)]),
        lambda: opt.apply_gradients(
            [(np.ones(3, np.float16), half)], skip_gradients_aggregation=True
        ),
    ):
        try:
            strategy.run(call)
        except (TypeError, RuntimeError) as exc:
            errors.append(str(exc))
    return errors


def _initial(shape):
    return np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)


def _checkpointed(strategy, kind, restore, steps, first_step, save_at=None):
    """Restores ``restore`` (if any; else starts from _initial), trains ``steps`` steps numbered
    from ``first_step`` (every replica passes the same gradient, so the mean does not depend
    on the number of replicas) and writes ``save_at[step]`` after that many steps; returns the
    variables and every slot, whole (a collective with sharded slots)."""
    from pycollective import strategies as ds

    with strategy.scope():
        variables = [ds.Variable(_initial(s)) for s in SHAPES]
        opt = _optimizer(kind)
    ckpt = ds.Checkpoint(model=variables, opt=opt)
    if restore:
        ckpt.restore(restore).assert_consumed()

    def step_fn(step):
        opt.apply_gradients(zip(_grads(variables, 0, step), variables))

    for step in range(first_step, first_step + steps):
        strategy.run(step_fn, args=(step,))
        if save_at and step + 1 in save_at:
            ckpt.write(save_at[step + 1])
    return {
        "params": [np.asarray(v).tolist() for v in variables],
        "slots": {
            f"{i}/{name}": np.asarray(opt.get_slot(v, name).numpy()).tolist()
            for i, v in enumerate(variables)
            for name in opt.get_slot_names()
        },
        "iterations": int(opt.iterations.numpy()),
    }


def _two_workers(rank, n, folder):
    """Parity with 1 and 2 local replicas; refusals; the uninterrupted runs whose checkpoints
    the other stages restore: sharded (saved at step 10) and unsharded (saved at step 20)."""
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    out: dict = {"errors": _refusals()}
    for kind in KINDS:
        out[kind] = {
            "parity": [_parity(kind, local) for local in (1, 2)],
            "sharded": _checkpointed(
                ds.MultiWorkerMirroredStrategy(shard_optimizer_state=True),
                kind,
                None,
                20,
                0,
                {10: f"{folder}/{kind}-sharded2-step10.npz"},
            ),
            "plain": _checkpointed(
                ds.MultiWorkerMirroredStrategy(),
                kind,
                None,
                30,
                0,
                {20: f"{folder}/{kind}-plain2-step20.npz"},
            ),
        }
    pc.shutdown()
    return out


def _three_workers(rank, n, folder):
    """Parity with uneven shards; sharded restores of the 2-worker checkpoints, sharded and
    unsharded, each trained on to where the uninterrupted run stopped."""
    import pycollective as pc
    from pycollective import strategies as ds

    pc.init()
    out = {}
    for kind in KINDS:
        strategy = ds.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
        out[kind] = {
            "parity": [_parity(kind, 1)],
            "from_sharded": _checkpointed(
                strategy, kind, f"{folder}/{kind}-sharded2-step10.npz", 10, 10
            ),
            "from_plain": _checkpointed(
                strategy,
                kind,
                f"{folder}/{kind}-plain2-step20.npz",
                10,
                20,
                {30: f"{folder}/{kind}-sharded3-step30.npz"},
            ),
        }
    pc.shutdown()
    return out


KINDS = ("momentum", "adam")
SLOT_NAMES = {"momentum": ("momentum",), "adam": ("m", "v")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both multi-process stages, once for the module (process start-up dominates their
    time): 2 workers, then 3 workers restoring what the 2 wrote."""
    import os

    saved = {
        k: os.environ.pop(k) for k in ("PYCOLLECTIVE_CPU_REPLICAS", "TF_CONFIG") if k in os.environ
    }
    folder = str(tmp_path_factory.mktemp("zero"))
    try:
        two = run_ranks(_two_workers, 2, folder, timeout=60)
        three = run_ranks(_three_workers, 3, folder, timeout=60)
    finally:
        os.environ.update(saved)
    return {"folder": folder, 2: two, 3: three}


def _close(a, b, tol=1e-5):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) < tol


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_sharded_matches_unsharded_after_50_steps(runs, kind):
    elems = sum(int(np.prod(s)) for s in SHAPES)
    slots = 1 if kind == "momentum" else 2
    for workers in (2, 3):
        for rank, res in enumerate(runs[workers]):
            for local, r in zip((1, 2), res[kind]["parity"]):
                where = (kind, workers, local, rank)
                assert r["max_diff"] < 1e-5, (where, r["max_diff"])
                assert r["slot_diff"] < 1e-5, (where, r["slot_diff"])
                assert r["local_copies_equal"], where
                # Each worker holds its chunk of every slot (a tensor's chunks differ by at
                # most one element), one for all its local replicas.
                plain, sharded = r["state_bytes"]
                assert plain == slots * elems * 4 * local, (where, plain)
                assert abs(sharded - slots * elems * 4 / workers) <= slots * len(SHAPES) * 4, (
                    where,
                    sharded,
                )
                assert r["calls"].get("allreduce_update") == 50 * len(SHAPES), r["calls"]
                # Every worker ends with the same variables, bit for bit.
                assert r["params"] == runs[workers][0][kind]["parity"][local - 1]["params"]


@pytest.mark.timeout(30)
def test_what_sharding_cannot_do_is_refused(runs):
    for res in runs[2]:
        errors = res["errors"]
        assert len(errors) == 2, errors
        assert "float16" in errors[0] and "shard_optimizer_state" in errors[0], errors[0]
        assert "skip_gradients_aggregation" in errors[1], errors[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_checkpoints_restore_across_sharding_and_worker_counts(runs, kind, monkeypatch):
    from pycollective import strategies as ds

    monkeypatch.delenv("PYCOLLECTIVE_CPU_REPLICAS", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    folder = runs["folder"]
    sharded2 = runs[2][0][kind]["sharded"]  # uninterrupted, 20 steps
    plain2 = runs[2][0][kind]["plain"]  # uninterrupted, 30 steps

    # Saved sharded by 2 workers, restored unsharded by 1 (this process), 10 more steps.
    single = ds.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
    assert not single.extended._shard_optimizer_state  # one worker: nothing to shard
    one = _checkpointed(single, kind, f"{folder}/{kind}-sharded2-step10.npz", 10, 10)
    assert one["iterations"] == 20
    for a, b in zip(one["params"], sharded2["params"]):
        assert _close(a, b), kind
    for key, value in sharded2["slots"].items():
        assert _close(one["slots"][key], value), key

    for rank, res in enumerate(runs[3]):
        # Saved sharded by 2 workers, restored sharded by 3.
        got = res[kind]["from_sharded"]
        assert got["iterations"] == 20
        for a, b in zip(got["params"], sharded2["params"]):
            assert _close(a, b), (kind, rank)
        for key, value in sharded2["slots"].items():
            assert _close(got["slots"][key], value), (kind, rank, key)
        # Saved unsharded by 2 workers, restored sharded by 3.
        got = res[kind]["from_plain"]
        assert got["iterations"] == 30
        for a, b in zip(got["params"], plain2["params"]):
            assert _close(a, b), (kind, rank)
        for key, value in plain2["slots"].items():
            assert _close(got["slots"][key], value), (kind, rank, key)

    # Written sharded by 3 workers (uneven shards): whole slots, as the unsharded run has them.
    with np.load(f"{folder}/{kind}-sharded3-step30.npz") as stored:
        assert int(stored["opt/iterations"]) == 30
        for i, shape in enumerate(SHAPES):
            for name in SLOT_NAMES[kind]:
                value = stored[f"opt/slots/model/{i}/{name}"]
                assert value.shape == shape
                assert _close(value, plain2["slots"][f"{i}/{name}"]), (i, name)
