"""Regenerates pycollective/_C.pyi, the type stubs of the native module, from the installed
extension; or checks (--check) that the committed stubs are what the generator writes now, so
that a binding change without new stubs fails CI.

    pip install . && python .ci/gen_stubs.py           # after changing csrc/bindings
    python .ci/gen_stubs.py --check                     # CI

Runs pybind11-stubgen (pinned: its output format is part of what is compared) from outside the
repository, so that the installed package, with its compiled _C, is the one imported. The
extension's pybind11 is pinned in pyproject.toml's build requirements for the same reason.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUBGEN_VERSION = "3.0.0"
STUBS = ROOT / "pycollective" / "_C.pyi"


def generate(out: Path) -> str:
    command = [sys.executable, "-m", "pybind11_stubgen", "pycollective._C", "-o", str(out)]
    result = subprocess.run(command, cwd=out, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"gen_stubs: pybind11-stubgen failed:\n{result.stdout}{result.stderr}\n"
            f"(needs pybind11-stubgen=={STUBGEN_VERSION} and pycollective installed)"
        )
    return (out / "pycollective" / "_C.pyi").read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument(
        "--print-version",
        action="store_true",
        help="print the pybind11-stubgen version the stubs come from, and exit",
    )
    args = parser.parse_args()
    if args.print_version:
        print(STUBGEN_VERSION)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    if not args.check:
        STUBS.write_text(fresh)
        print(f"gen_stubs: wrote {STUBS.relative_to(ROOT)}")
        return 0
    old = STUBS.read_text() if STUBS.exists() else ""
    if old != fresh:
        sys.stdout.writelines(
            difflib.unified_diff(
                old.splitlines(True), fresh.splitlines(True), "committed/_C.pyi", "generated/_C.pyi"
            )
        )
        print(
            "gen_stubs: pycollective/_C.pyi is out of date; run `pip install . && python "
            ".ci/gen_stubs.py` and commit it",
            file=sys.stderr,
        )
        return 1
    print("gen_stubs: pycollective/_C.pyi is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
