#!/usr/bin/env bash
# Checks that keep the tree's structure honest, each failing CI with what to run to fix it:
#  - the protobuf/gRPC modules are exactly what the pinned generator writes (.ci/gen_protos.py);
#  - strategies/ imports depend only downward, without cycles (.importlinter, `lint-imports`);
#  - csrc/ includes depend only downward (.ci/check_layers.py).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tools="$(mktemp -d /tmp/pycollective-checks.XXXXXX)"
trap 'rm -rf "$tools"' EXIT
cd "$repo"

python .ci/check_layers.py

python -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "grpcio-tools==$(python .ci/gen_protos.py --print-version)" \
  "import-linter>=2.1"
"$tools/venv/bin/python" .ci/gen_protos.py --check
"$tools/venv/bin/lint-imports" --no-cache
