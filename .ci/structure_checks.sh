#!/usr/bin/env bash
# Checks that keep the tree's structure honest, each failing CI with what to run to fix it:
#  - the protobuf/gRPC modules are exactly what the pinned generator writes (.ci/gen_protos.py).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tools="$(mktemp -d /tmp/pycollective-checks.XXXXXX)"
trap 'rm -rf "$tools"' EXIT
cd "$repo"

python -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "grpcio-tools==$(python .ci/gen_protos.py --print-version)"
"$tools/venv/bin/python" .ci/gen_protos.py --check
