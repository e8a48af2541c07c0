"""Regenerates the protobuf/gRPC modules from their .proto files, or checks (--check) that the
committed ones are exactly what the generator writes, so that nobody edits them by hand.

    python .ci/gen_protos.py            # after changing a .proto (needs grpcio-tools==VERSION)
    python .ci/gen_protos.py --check    # CI: fails with a diff when they differ

The one rewrite after protoc: the ``*_pb2_grpc.py`` module imports its ``*_pb2`` sibling by the
.proto's path (``from pycollective.rendezvous import coordination_pb2``), which breaks for
``strategies/`` (installed as ``pycollective.strategies``); the sibling is imported relatively
instead. The grpcio-tools version is pinned: it fixes the protobuf gencode version written into
the modules and checked at import time.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRPCIO_TOOLS_VERSION = "1.85.1"
PROTOS = [
    "pycollective/rendezvous/coordination.proto",
    "pycollective/rendezvous/dataplane.proto",
    "strategies/parameter_server/ps.proto",
]


def generate(out: Path) -> list[Path]:
    """Runs protoc for every .proto into `out`; returns the generated files, relative."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit(
            f"gen_protos: needs grpcio-tools=={GRPCIO_TOOLS_VERSION} "
            f"(pip install grpcio-tools=={GRPCIO_TOOLS_VERSION})"
        ) from None
    import importlib.metadata

    found = importlib.metadata.version("grpcio-tools")
    if found != GRPCIO_TOOLS_VERSION:
        raise SystemExit(
            f"gen_protos: grpcio-tools {found} is installed; the committed modules "
            f"come from {GRPCIO_TOOLS_VERSION}. Install that version, or bump "
            "GRPCIO_TOOLS_VERSION here and regenerate."
        )
    include = Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--proto_path={include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *PROTOS,
        ]
    )
    if code != 0:
        raise SystemExit(f"gen_protos: protoc failed ({code})")
    generated = []
    for proto in PROTOS:
        stem = proto[: -len(".proto")]
        generated += [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2_grpc.py")]
    for rel in generated:
        path = out / rel
        text = path.read_text()
        if rel.name.endswith("_pb2_grpc.py"):
            text = re.sub(
                r"^from [\w.]+ import (\w+_pb2 as )", r"from . import \1", text, count=1, flags=re.M
            )
        path.write_text(text)
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the committed modules instead of writing them",
    )
    parser.add_argument(
        "--print-version",
        action="store_true",
        help="print the grpcio-tools version the modules come from, and exit",
    )
    args = parser.parse_args()
    if args.print_version:
        print(GRPCIO_TOOLS_VERSION)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        differ = False
        for rel in generate(out):
            fresh, committed = (out / rel).read_text(), ROOT / rel
            if not args.check:
                committed.write_text(fresh)
                print(f"gen_protos: wrote {rel}")
                continue
            old = committed.read_text() if committed.exists() else ""
            if old != fresh:
                differ = True
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(True),
                        fresh.splitlines(True),
                        f"committed/{rel}",
                        f"generated/{rel}",
                    )
                )
        if differ:
            print(
                "gen_protos: the committed modules differ from the generator's output; run "
                "`python .ci/gen_protos.py` and commit the result",
                file=sys.stderr,
            )
            return 1
    if args.check:
        print(f"gen_protos: {len(PROTOS)} protos, generated modules up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
