"""What the build reports, and the algorithm names."""

from __future__ import annotations

import pycollective as pc


def test_build_info_describes_the_build():
    info = pc.build_info()
    assert info["version"] == pc.__version__
    assert info["simd"] in ("generic", "avx2", "avx512")
    assert isinstance(info["cuda"], bool)
    assert info["compiler"] and "-O3" in info["cxx_flags"]


def test_algorithm_names():
    assert pc.algorithms() == [
        "ring",
        "halving_doubling",
        "hierarchical",
        "reduce_to_one",
        "direct",
        "slots",
        "staged",
        "inline",
        "auto",
    ]


def test_import_needs_no_torch():
    """pycollective imports torch lazily: only pycollective.torch (the backend) needs it."""
    import subprocess
    import sys

    code = "import sys, pycollective; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
