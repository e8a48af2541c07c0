"""auto's trial on in-process replicas (csrc/local/measured_choice.h): the first calls of a shape
time the model's candidates, later calls run the fastest and now and then another. Every call
must give the right result (calls run different algorithms on the user's data), the trial must
settle within ``auto_trial_calls``, and PYCOLLECTIVE_AUTO_TRIALS=0 must leave the model's choice
alone."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pycollective as pc

#: 2 replicas x 1 MiB: on the VMs measured, the model prices halving-doubling, inline, ring and
#: direct within 2x of each other, so there is a trial to run
NBYTES = 1 << 20


def _candidates(explained: str) -> list[str]:
    return re.findall(r" (\w+)=[\d.?]", explained.split("(", 1)[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("inplace", [False, True])
def test_every_call_of_the_trial_is_right_and_the_trial_settles(world, inplace):
    comm = pc.LocalCommunicator(world)
    assert comm.auto_trial_calls == 4 * 4  # the defaults: 4 calls in a row (2 count) of up to 4
    rng = np.random.default_rng(world)
    count = NBYTES // 4
    # Past the trial far enough that calls of other candidates come in between (every 32 calls).
    for step in range(comm.auto_trial_calls + 40):
        xs = [rng.integers(-8, 8, count).astype(np.float32) for _ in range(world)]
        want = np.sum(xs, axis=0)  # small integers: exact in any order of summing
        ys = comm.allreduce(xs, inplace=inplace)
        for r, y in enumerate(ys):
            np.testing.assert_array_equal(y, want, err_msg=f"call {step}, replica {r}")
        if inplace:
            assert all(y is x for y, x in zip(ys, xs))
        explained = comm.explain("allreduce", NBYTES)
        if step == comm.auto_trial_calls - 1 and "nothing to measure" not in explained:
            assert "(measured," in explained, explained
    if "nothing to measure" in explained:  # a model on another machine may price one alone
        return
    chosen = explained.split()[0]
    candidates = _candidates(explained)
    assert len(candidates) >= 2 and chosen in candidates, explained


@pytest.mark.timeout(60)
def test_each_shape_has_its_own_trial():
    comm = pc.LocalCommunicator(2)
    x = [np.ones(NBYTES // 4, np.float32), np.ones(NBYTES // 4, np.float32)]
    for _ in range(comm.auto_trial_calls):
        comm.allreduce(x)
    assert "(measured," in comm.explain("allreduce", NBYTES)
    # Another size, another dtype, another collective: not called yet, so the model's answer.
    for other in (
        comm.explain("allreduce", 2 * NBYTES),
        comm.explain("allreduce", NBYTES, dtype="float64"),
        comm.explain("reduce_scatter", NBYTES),
    ):
        assert "model" in other and "measured" not in other, other


@pytest.mark.timeout(60)
def test_no_trials_keeps_the_model_choice(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_AUTO_TRIALS", "0")
    comm = pc.LocalCommunicator(2)
    assert comm.auto_trial_calls == 0
    before = comm.explain("allreduce", NBYTES)
    x = [np.ones(NBYTES // 4, np.float32), np.full(NBYTES // 4, 2, np.float32)]
    for _ in range(12):
        y = comm.allreduce(x)
    np.testing.assert_array_equal(y[1], np.full(NBYTES // 4, 3, np.float32))
    assert comm.explain("allreduce", NBYTES) == before, before


@pytest.mark.timeout(60)
def test_a_tiny_call_has_nothing_to_measure():
    # 8 bytes: the model prices inline far below every threaded algorithm (tens of us of
    # thread wake-ups against a few loads), so no trial runs.
    comm = pc.LocalCommunicator(2)
    x = [np.ones(2, np.float32), np.ones(2, np.float32)]
    comm.allreduce(x)
    explained = comm.explain("allreduce", 8)
    assert explained.startswith("inline") and "nothing to measure" in explained, explained


@pytest.mark.timeout(60)
def test_a_tuned_table_set_later_decides_again():
    from pycollective._calls import KINDS

    comm = pc.LocalCommunicator(2)
    x = [np.ones(NBYTES // 4, np.float32), np.ones(NBYTES // 4, np.float32)]
    for _ in range(comm.auto_trial_calls):
        comm.allreduce(x)
    # New model inputs: the trial's answer no longer stands, the table's does.
    comm._group.set_tuned([(KINDS["allreduce"], 1 << 30, "ring")])
    explained = comm.explain("allreduce", NBYTES)
    assert explained.startswith("ring") and "tuned table" in explained, explained
    np.testing.assert_array_equal(comm.allreduce(x)[0], np.full(NBYTES // 4, 2, np.float32))
