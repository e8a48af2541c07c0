"""Fails when a file of csrc/ includes a header from a layer above its own (../shared/DESIGN.md
draws the layers; docs/design.md lists them as built). Each layer may include itself and the
layers below it, never one above: a transport never sees an algorithm.

    python .ci/check_layers.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Lowest first. Folders on one line are peers: neither may include the other.
LAYERS = [
    ["core"],  # errors, logging, knobs, threads, memory helpers
    ["reduce", "cuda"],  # reduction kernels (CPU), device operations (CUDA or none)
    ["transport"],  # bytes between two ranks: frames, inproc, shm, tcp
    ["comm"],  # the communicator: links, executor, work handles
    ["algorithms"],  # collectives written once over a communicator's links
    ["optim", "local"],  # optimizer steps fused into collectives; in-process replica groups
    ["bindings"],  # the pybind11 module pycollective._C
]
# cuda sits beside reduce but may use the kernels' dtype/op tables.
ALLOWED_PEERS = {("cuda", "reduce")}
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.M)


def level_of() -> dict[str, int]:
    return {folder: i for i, row in enumerate(LAYERS) for folder in row}


def violations() -> list[str]:
    level = level_of()
    found = []
    for path in sorted((ROOT / "csrc").rglob("*")):
        if path.suffix not in {".h", ".cc", ".cu", ".cuh"}:
            continue
        here = path.relative_to(ROOT / "csrc").parts[0]
        if here not in level:
            if path.parent != ROOT / "csrc":
                found.append(f"csrc/{here}/ is in no layer: add it to LAYERS in {__file__}")
            continue
        for match in _INCLUDE.finditer(path.read_text()):
            target = match.group(1)
            if target == here or target not in level:
                continue
            upward = level[target] > level[here]
            peer = level[target] == level[here] and (here, target) not in ALLOWED_PEERS
            if upward or peer:
                line = path.read_text()[: match.start()].count("\n") + 1
                found.append(
                    f"{path.relative_to(ROOT)}:{line}: {here}/ includes {target}/, "
                    f"which is {'above it' if upward else 'its peer'}"
                )
    return sorted(set(found))


def main() -> int:
    bad = violations()
    for line in bad:
        print(line)
    if bad:
        print(
            f"check_layers: {len(bad)} include(s) against the layering; move the code to the "
            "layer that owns it, or pass what it needs down (as transport/frame.h's namers do)",
            file=sys.stderr,
        )
        return 1
    print("check_layers: csrc/ includes only downward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
