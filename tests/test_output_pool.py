"""Result arrays of 1 MiB and more come from the output pool (csrc/core/output_pool.h): they are
ordinary writable numpy arrays, and their memory serves the next result once every array using
it is gone, never earlier."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pycollective as pc
from pycollective._ext import _C

# float32, 11 MiB: kept as a 12 MiB block (whole huge pages), a size no other test asks for, so
# the pool's blocks of this size are only this test's.
COUNT = (11 << 20) // 4
BLOCK = 12 << 20


@pytest.mark.timeout(60)
def test_released_results_are_reused_and_views_keep_theirs():
    comm = pc.LocalCommunicator(2)
    xs = [np.full(COUNT, 1.0, np.float32), np.full(COUNT, 2.0, np.float32)]
    ys = comm.allreduce(xs)
    assert all(type(y) is np.ndarray and y.flags.writeable and y.flags.c_contiguous for y in ys)
    assert all(np.all(y == 3.0) for y in ys)
    gc.collect()
    base = _C.output_pool_cached_bytes()
    view = ys[1][5:10]  # keeps replica 1's block alive
    del ys
    gc.collect()
    assert _C.output_pool_cached_bytes() == base + BLOCK  # replica 0's block only
    zs = comm.allreduce(xs)  # takes the free block, and a new one
    assert _C.output_pool_cached_bytes() == base
    view[:] = 7.0  # still its own memory: the new results are untouched
    assert all(np.all(z == 3.0) for z in zs)
    del zs, view
    gc.collect()
    assert _C.output_pool_cached_bytes() == base + 3 * BLOCK  # the view's block too


@pytest.mark.timeout(60)
def test_small_results_and_a_zero_cap_keep_nothing(monkeypatch):
    from pycollective import config

    comm = pc.LocalCommunicator(2)
    gc.collect()
    base = _C.output_pool_cached_bytes()
    small = comm.allreduce([np.ones(1000, np.float32)] * 2)
    del small
    gc.collect()
    assert _C.output_pool_cached_bytes() == base
    monkeypatch.setenv("PYCOLLECTIVE_OUTPUT_POOL_BYTES", "0")
    config.reload()
    try:
        ys = comm.allreduce([np.ones(COUNT, np.float32)] * 2)  # may still take kept blocks
        assert np.all(ys[0] == 2.0)
        kept = _C.output_pool_cached_bytes()
        del ys
        gc.collect()
        assert _C.output_pool_cached_bytes() == kept  # released, nothing kept
    finally:
        monkeypatch.delenv("PYCOLLECTIVE_OUTPUT_POOL_BYTES")
        config.reload()


@pytest.mark.timeout(60)
def test_a_full_pool_gives_way_to_the_size_released_last(monkeypatch):
    """A loop that moves on to larger results must not find the pool full of the sizes it no
    longer asks for: the blocks released longest ago make room."""
    from pycollective import config

    comm = pc.LocalCommunicator(2)
    earlier, later = (13 << 20) // 4, (15 << 20) // 4  # kept as 14 and 16 MiB blocks
    monkeypatch.setenv("PYCOLLECTIVE_OUTPUT_POOL_BYTES", str(32 << 20))
    config.reload()
    try:
        comm.allreduce([np.ones(earlier, np.float32)] * 2)  # the results are released at once
        gc.collect()
        assert _C.output_pool_cached_bytes() <= 32 << 20  # older blocks of any size made room
        ys = comm.allreduce([np.ones(later, np.float32)] * 2)
        del ys
        gc.collect()
        kept = _C.output_pool_cached_bytes()
        zs = comm.allreduce([np.ones(later, np.float32)] * 2)
        # Both results came from the pool (no page faults): the 14 MiB blocks and anything
        # older gave way to them. Before, they were unmapped, the pool full of 14 MiB blocks.
        assert kept - _C.output_pool_cached_bytes() == 32 << 20
        assert all(np.all(z == 2.0) for z in zs)
    finally:
        monkeypatch.delenv("PYCOLLECTIVE_OUTPUT_POOL_BYTES")
        config.reload()
