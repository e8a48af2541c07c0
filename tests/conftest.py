"""Test defaults: short collective timeouts (a hang becomes an error inside the test, well before
pytest-timeout's backstop), a bounded, derandomized hypothesis profile for CI."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYCOLLECTIVE_TIMEOUT", "60")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=200, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session", autouse=True)
def _neutral_working_directory(tmp_path_factory):
    """Run the session outside the repository. `python -m pycollective...` puts the current
    directory first on sys.path, where the source folder (no compiled _C) would shadow the
    installed package in every subprocess a test starts."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture
def small_segments(monkeypatch):
    """Forces many pipeline segments per chunk, so segment arithmetic is exercised on small
    arrays (gloo's maxSegmentSize test hook)."""
    from pycollective import config

    monkeypatch.setenv("PYCOLLECTIVE_SEGMENT_BYTES", "24")
    config.reload()  # variables are read once; groups created from here on see it
    yield 24
    monkeypatch.undo()
    config.reload()
