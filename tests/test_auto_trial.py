"""auto's trial on in-process replicas (csrc/local/measured_choice.h): where the model prices two
or more algorithms within 1.25x of each other (`inline`, priced by a model of its own, within
1.5x of the others), the first calls of a shape time them, later calls
run the fastest and now and then another. Every call must give the right result (calls run
different algorithms on the user's data), the trial must settle within ``auto_trial_calls``, a
choice the model is sure of is not measured, and PYCOLLECTIVE_AUTO_TRIALS=0 must leave the
model's choice alone."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import pycollective as pc

#: comm/auto_candidates.h kCandidateWindow, and kAcrossModelsWindow for `inline` (priced by a
#: model of its own) against the algorithms (priced by the links' costs)
WINDOW = 1.25
ACROSS_MODELS_WINDOW = 1.5
#: comm/auto_candidates.h kOnceAfter: calls of a shape before its reserves priced within 2x have
#: their one check
ONCE_AFTER = 256


def _model_prices(explained: str) -> dict[str, float]:
    """The model's table in an explain before a shape's first call: every price, `inline` first."""
    return {a: float(s) for a, s in re.findall(r" (\w+)=([\d.e+]+)us", explained)}


def _candidates(explained: str) -> list[str]:
    return re.findall(r" (\w+)=[\d.?]", explained.split("(", 1)[1])


@functools.cache
def near_tie() -> tuple[int, int]:
    """(replicas, bytes) of an all-reduce whose model table prices two algorithms within the
    window: where there is a trial to run on this machine (the model's prices follow its cache;
    on the EPYC VM 3 x 4 MiB, 4 x 2 MiB, 8 x 1 MiB, ...)."""
    for world in range(3, 9):
        comm = pc.LocalCommunicator(world)
        for nbytes in (int(256 * 1024 * 1.5**k) // 64 * 64 for k in range(11)):
            table = comm.explain("allreduce", nbytes)
            prices = sorted(float(p) for p in re.findall(r"=([\d.e+]+)us", table))
            if len(prices) >= 2 and prices[1] <= WINDOW * prices[0]:
                return world, nbytes
    pytest.skip("the model prices no two algorithms within 1.25x from 3 to 8 replicas here")


def _inputs(world: int, nbytes: int, fill=lambda r: r + 1.0) -> list[np.ndarray]:
    return [np.full(nbytes // 4, fill(r), np.float32) for r in range(world)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("inplace", [False, True])
def test_every_call_of_the_trial_is_right_and_the_trial_settles(inplace):
    world, nbytes = near_tie()
    comm = pc.LocalCommunicator(world)
    assert comm.auto_trial_calls == 4 * 4  # the defaults: 4 calls in a row (2 count) of up to 4
    rng = np.random.default_rng(world)
    count = nbytes // 4
    # Past the trial far enough that calls of other candidates come in between (every 32 calls).
    for step in range(comm.auto_trial_calls + 40):
        xs = [rng.integers(-8, 8, count).astype(np.float32) for _ in range(world)]
        want = np.sum(xs, axis=0)  # small integers: exact in any order of summing
        ys = comm.allreduce(xs, inplace=inplace)
        for r, y in enumerate(ys):
            np.testing.assert_array_equal(y, want, err_msg=f"call {step}, replica {r}")
        if inplace:
            assert all(y is x for y, x in zip(ys, xs))
        explained = comm.explain("allreduce", nbytes)
        if step == comm.auto_trial_calls - 1:
            assert "(measured," in explained, explained
    chosen = explained.split()[0]
    candidates = _candidates(explained)
    assert len(candidates) >= 2 and chosen in candidates, explained


@pytest.mark.timeout(60)
def test_each_shape_has_its_own_trial():
    world, nbytes = near_tie()
    comm = pc.LocalCommunicator(world)
    x = _inputs(world, nbytes)
    for _ in range(comm.auto_trial_calls):
        comm.allreduce(x)
    assert "(measured," in comm.explain("allreduce", nbytes)
    # Another size, another dtype, another collective: not called yet, so the model's answer.
    for other in (
        comm.explain("allreduce", 2 * nbytes),
        comm.explain("allreduce", nbytes, dtype="float64"),
        comm.explain("reduce_scatter", nbytes),
    ):
        assert "model" in other and "measured" not in other, other


@pytest.mark.timeout(60)
def test_no_trials_keeps_the_model_choice(monkeypatch):
    world, nbytes = near_tie()
    monkeypatch.setenv("PYCOLLECTIVE_AUTO_TRIALS", "0")
    comm = pc.LocalCommunicator(world)
    assert comm.auto_trial_calls == 0
    before = comm.explain("allreduce", nbytes)
    x = _inputs(world, nbytes)
    for _ in range(12):
        y = comm.allreduce(x)
    want = world * (world + 1) / 2
    np.testing.assert_array_equal(y[-1], np.full(nbytes // 4, want, np.float32))
    assert comm.explain("allreduce", nbytes) == before, before


@pytest.mark.timeout(60)
def test_a_tiny_call_has_nothing_to_measure():
    # 8 bytes: the model prices inline far below every threaded algorithm (tens of us of
    # thread wake-ups against a few loads), so no trial runs.
    comm = pc.LocalCommunicator(2)
    x = [np.ones(2, np.float32), np.ones(2, np.float32)]
    comm.allreduce(x)
    explained = comm.explain("allreduce", 8)
    assert explained.startswith("inline") and "nothing to measure" in explained, explained


def sure_choice() -> tuple[pc.LocalCommunicator, str]:
    """2 replicas x 64 MiB: far out of cache, where the model prices one algorithm well ahead
    (skips where this machine's model sees a near tie there). The group and its model table."""
    comm = pc.LocalCommunicator(2)
    table = comm.explain("allreduce", 64 << 20)
    prices = sorted(float(p) for p in re.findall(r"=([\d.e+]+)us", table))
    if prices[1] <= WINDOW * prices[0]:
        pytest.skip(f"the model prices a near tie at 2 x 64 MiB on this machine: {table}")
    return comm, table


@pytest.mark.timeout(60)
def test_a_choice_the_model_is_sure_of_is_watched_and_its_nearest_reserves_checked_once():
    world, nbytes = 2, 64 << 20
    comm, table = sure_choice()
    model_best = table.split()[0]
    priced = _model_prices(table)
    once = {a for a, s in priced.items() if a != model_best and s <= 2 * priced[model_best]}
    x = _inputs(world, nbytes)
    want = np.full(nbytes // 4, world * (world + 1) / 2, np.float32)
    comm.allreduce(x)
    explained = comm.explain("allreduce", nbytes)
    # Watched alone: the others wait in reserve, raced only should it slow 2x...
    assert "no other algorithm priced near it: its calls are timed" in explained, explained
    # ...but those priced within 2x race once, after the first ONCE_AFTER calls.
    out = [np.empty_like(v) for v in x]
    for step in range(ONCE_AFTER - 1):  # into out=: 64 MiB calls, a few seconds in all
        comm.allreduce(x, out=out)
        np.testing.assert_array_equal(
            out[step % world][:: 1 << 12], want[:: 1 << 12], f"call {step}"
        )
    explained = comm.explain("allreduce", nbytes)
    if once:
        assert set(_candidates(explained)) == once | {model_best}, explained
    for step in range(5 * len(once) + 8):
        comm.allreduce(x, out=out)
        np.testing.assert_array_equal(
            out[step % world][:: 1 << 12], want[:: 1 << 12], f"call {step}"
        )
    np.testing.assert_array_equal(out[0], want)
    explained = comm.explain("allreduce", nbytes)
    if explained.split()[0] == model_best:
        assert "no other algorithm priced near it: its calls are timed" in explained, explained
    else:  # one was 1.1x faster on this machine, and runs from then on
        assert explained.split()[0] in once, explained


def _near_ties(prices: dict[str, float]) -> list[str] | None:
    """The racers comm/auto_candidates.cc nearCandidates makes of a model table: within 1.25x of
    the cheapest of its own model (`inline`'s, or the links'), and 1.5x of the cheapest of all;
    None where a ratio sits too close to a window's edge for the table's six digits to say."""
    order = sorted(prices, key=lambda a: (prices[a], a == "inline"))
    cheapest = prices[order[0]]
    own = {}
    for a in order:
        own.setdefault(a == "inline", prices[a])
    for a in order:
        for ratio in (prices[a] / own[a == "inline"], prices[a] / cheapest):
            if any(abs(ratio / edge - 1) < 1e-3 for edge in (WINDOW, ACROSS_MODELS_WINDOW)):
                return None
    near = [
        a
        for a in order
        if prices[a] <= WINDOW * own[a == "inline"] and prices[a] <= ACROSS_MODELS_WINDOW * cheapest
    ]
    return near[:4]


@pytest.mark.timeout(60)
def test_the_trial_races_what_the_model_prices_near_and_inline_within_the_wider_window():
    # Before a shape's first call `explain` gives the model's table, `inline`'s price among the
    # algorithms'; the first call starts the trial, which names its racers. They are the near
    # ties of that table: `inline` (its own model) and the algorithms (the links' costs) race
    # within 1.5x of each other, two algorithms within 1.25x.
    sizes = sorted(
        {int(256 * 1024 * 1.5**k) // 64 * 64 for k in range(9)} | {1 << k for k in range(18, 24)}
    )
    across = None
    for world in range(2, 9):
        comm = pc.LocalCommunicator(world)
        for nbytes in sizes:
            prices = _model_prices(comm.explain("allreduce", nbytes))
            assert "inline" in prices and len(prices) >= 3, prices
            near = _near_ties(prices)
            comm.allreduce(_inputs(world, nbytes))
            explained = comm.explain("allreduce", nbytes)
            if near is None:
                continue
            if len(near) == 1:
                assert "no other algorithm priced near it" in explained, (near, explained)
                continue
            assert _candidates(explained) == near, (world, nbytes, prices, explained)
            threaded = min(prices[a] for a in near if a != "inline")
            if "inline" in near and max(threaded, prices["inline"]) > WINDOW * prices[near[0]]:
                across = across or (world, nbytes, comm)
    if across is None:
        pytest.skip("the model prices inline and the algorithms 1.25x-1.5x apart nowhere here")
    # Such a pair's trial times both.
    world, nbytes, comm = across
    x = _inputs(world, nbytes)
    want = np.full(nbytes // 4, world * (world + 1) / 2, np.float32)
    # Read as the trial settles: a check that starts on a later call (the trial may take fewer
    # calls than auto_trial_calls) times its candidate afresh, and shows "?" until it has.
    for step in range(comm.auto_trial_calls):
        y = comm.allreduce(x)
        np.testing.assert_array_equal(y[step % world], want, f"call {step}")
        explained = comm.explain("allreduce", nbytes)
        if "(measured," in explained:
            break
    assert "(measured," in explained, explained
    timed = re.findall(r" (\w+)=[\d.]+us \(model", explained)
    assert "inline" in timed and len(timed) >= 2, explained


@pytest.mark.timeout(60)
def test_a_tuned_table_set_later_decides_again():
    from pycollective._calls import KINDS

    world, nbytes = near_tie()
    comm = pc.LocalCommunicator(world)
    x = _inputs(world, nbytes, fill=lambda r: 1.0)
    for _ in range(comm.auto_trial_calls):
        comm.allreduce(x)
    # New model inputs: the trial's answer no longer stands, the table's does.
    comm._group.set_tuned([(KINDS["allreduce"], 1 << 30, "ring")])
    explained = comm.explain("allreduce", nbytes)
    assert explained.startswith("ring") and "tuned table" in explained, explained
    want = np.full(nbytes // 4, world, np.float32)
    np.testing.assert_array_equal(comm.allreduce(x)[0], want)


@pytest.mark.timeout(60)
def test_a_tuned_entry_leads_the_trial_and_the_model_races_it():
    # `pycollective tune` measured its table one size per row, into given outputs: on the calls
    # a program makes, the model's near ties time themselves against the table's entry.
    from pycollective._calls import KINDS

    world, nbytes = near_tie()
    comm = pc.LocalCommunicator(world)
    model = comm.explain("allreduce", nbytes)
    model_best = model.split()[0]
    # An entry the model does not price near its best, so that only the table brings it in
    # (1e36 and more: the model's mark of an algorithm it will never pick).
    priced = _model_prices(model)
    far = max((a for a in priced if a != model_best and priced[a] < 1e30), key=priced.get)
    comm._group.set_tuned([(KINDS["allreduce"], 1 << 30, far)])
    x = _inputs(world, nbytes)
    want = np.full(nbytes // 4, world * (world + 1) / 2, np.float32)
    for _ in range(comm.auto_trial_calls):
        np.testing.assert_array_equal(comm.allreduce(x)[-1], want)
    explained = comm.explain("allreduce", nbytes)
    assert "(measured," in explained, explained
    candidates = _candidates(explained)
    assert candidates[0] == far and model_best in candidates, explained
    assert f"{far}=" in explained and "(tuned table;" in explained, explained


@pytest.mark.timeout(60)
def test_a_tuned_entry_the_model_agrees_with_runs_first():
    from pycollective._calls import KINDS

    world, nbytes = 2, 64 << 20
    comm, table = sure_choice()
    comm._group.set_tuned([(KINDS["allreduce"], 1 << 30, table.split()[0])])
    comm.allreduce(_inputs(world, nbytes))
    explained = comm.explain("allreduce", nbytes)
    # Alone in the window: it runs, watched, its nearest reserves checked once (as untuned).
    assert explained.startswith(table.split()[0]) and "tuned table" in explained, explained
    assert "(measured," in explained or "no other algorithm priced near it" in explained, explained
