#!/usr/bin/env bash
# Checks that keep the tree's structure honest, each failing CI with what to run to fix it:
#  - the protobuf/gRPC modules are exactly what the pinned generator writes (.ci/gen_protos.py);
#  - strategies/ imports depend only downward, without cycles (.importlinter, `lint-imports`);
#  - csrc/ includes depend only downward (.ci/check_layers.py);
#  - style: ruff (lint and format) and clang-format, at the versions .pre-commit-config.yaml pins;
#  - the public API type-checks (mypy; [tool.mypy] in pyproject.toml lists the modules).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tools="$(mktemp -d /tmp/pycollective-checks.XXXXXX)"
trap 'rm -rf "$tools"' EXIT
cd "$repo"

python .ci/check_layers.py

python -m venv "$tools/venv"
pinned() {  # the version .pre-commit-config.yaml pins for a tool
  grep -oE "\"$1==[0-9.]+\"" .pre-commit-config.yaml | head -1 | tr -d '"'
}
"$tools/venv/bin/pip" install -q "grpcio-tools==$(python .ci/gen_protos.py --print-version)" \
  "import-linter>=2.1" "$(pinned ruff)" "$(pinned clang-format)" "mypy==2.4.1"
"$tools/venv/bin/python" .ci/gen_protos.py --check
"$tools/venv/bin/lint-imports" --no-cache
"$tools/venv/bin/ruff" check .
"$tools/venv/bin/ruff" format --check . || {
  echo "style: run \`ruff format .\` (or pre-commit) and commit the result" >&2; exit 1; }
git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.cu' 'tests/native/*.cc' 'tests/native/*.h' |
  xargs "$tools/venv/bin/clang-format" --dry-run -Werror || {
  echo "style: run clang-format -i on the files above (or pre-commit) and commit" >&2; exit 1; }
"$tools/venv/bin/mypy"
echo "structure checks: passed"
