"""Where in-process `auto` counts a call as in cache (core/cache_probe.h): the sizes /sys
reports are read right, and the OS's figure is taken only where it is plausible."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pycollective as pc

MiB = 1 << 20


@pytest.mark.parametrize(
    "text, expected",
    [("32768K", 32 * MiB), ("512K", 512 << 10), ("2M", 2 * MiB), ("1G", 1 << 30), ("4096", 4096)],
)
def test_sysfs_cache_sizes_are_read_in_bytes(text, expected):
    assert pc._C.parse_cache_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "32768Q", "abc", "12KiB", "9" * 20])
def test_unreadable_cache_sizes_are_zero(text):
    assert pc._C.parse_cache_size(text) == 0


@pytest.mark.parametrize(
    "measured, reported, expected",
    [
        (16 * MiB, 32 * MiB, 32 * MiB),  # the probe reached its end: the OS's L3 stands
        (16 * MiB, 64 * MiB, 64 * MiB),
        (16 * MiB, 256 * MiB, 16 * MiB),  # a whole socket's L3, which a VM does not keep
        (16 * MiB, 0, 16 * MiB),  # nothing reported
        (16 * MiB, 8 * MiB, 16 * MiB),  # the pass saw more than the OS says
        (2 * MiB, 32 * MiB, 2 * MiB),  # the cache ended before the probe's end: measured wins
        (8 * MiB, 32 * MiB, 8 * MiB),
    ],
)
def test_the_reported_cache_extends_only_a_line_that_reached_the_probes_end(
    measured, reported, expected
):
    assert pc._C.line_with_reported_cache(measured, reported) == expected


GB = 1e9


@pytest.mark.parametrize(
    "reference, passes, reported, expected",
    [
        # The EPYC VM in a good stretch, had the check failed: 1-16 MiB all in cache, the
        # probe's end reached, the OS's 32 MiB stands.
        (45 * GB, [100, 98, 100, 100, 80], 32 * MiB, 32 * MiB),
        # Its bad stretch: 2-8 MiB at the reference's speed. No step, no evidence of a small
        # cache: the reported line, not 1 MiB.
        (47 * GB, [55, 52, 50, 48, 46], 32 * MiB, 32 * MiB),
        # Flat with a socket's 256 MiB reported, or nothing: no cache to trust, the floor.
        (47 * GB, [55, 52, 50, 48, 46], 256 * MiB, MiB),
        (47 * GB, [55, 52, 50, 48, 46], 0, MiB),
        # The Xeon VM: 1-2 MiB in its L2, 4-64 MiB at memory speed, 480 MiB reported.
        (30 * GB, [80, 60, 31, 30, 30], 480 * MiB, 2 * MiB),
        # A step at 1 MiB only: that is the line, whatever the OS says.
        (30 * GB, [80, 40, 31, 30, 30], 32 * MiB, MiB),
        # The walk stops at the first set that falls short, even if a larger one passes.
        (30 * GB, [80, 80, 40, 80, 80], 480 * MiB, 2 * MiB),
    ],
)
def test_the_line_from_the_probes_passes(reference, passes, reported, expected):
    rates = [p * GB for p in passes]
    assert pc._C.line_from_passes(reference, rates, reported) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setting, expected", [("12345678", 12345678), ("0", None)])
def test_the_line_is_the_setting_or_a_measured_size(setting, expected):
    code = "import pycollective as pc; print(pc._C.cache_resident_bytes())"
    env = dict(os.environ, PYCOLLECTIVE_CACHE_BYTES=setting)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50
    )
    assert out.returncode == 0, out.stderr
    line = int(out.stdout)
    if expected is not None:
        assert line == expected
    else:  # measured: a probe size, or a reported cache it confirmed
        assert MiB <= line <= 64 * MiB
