"""``pycollective bench-figures``: remakes the pictures in docs/ with one command. Each comes
from one `pycollective bench` run, whose command line, machine and date the picture's footer
states; the tables printed by the same runs go to ``OUT/*.txt``, beside the pictures."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

# File name -> the `pycollective bench` arguments that make it (docs/benchmarks.md shows both).
FIGURES = {
    "bench_procs.png": ["--transports", "shm,tcp,grpc"],
    "bench_inproc.png": ["--mode", "inproc", "-b", "4K", "-e", "256M"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pycollective bench-figures", description=__doc__)
    parser.add_argument("--out", default="docs", help="folder for the pictures (default: docs)")
    parser.add_argument(
        "--only",
        choices=sorted(FIGURES),
        action="append",
        help="remake this picture only (repeatable)",
    )
    args = parser.parse_args(argv)
    cli = os.path.join(os.path.dirname(sys.executable), "pycollective")
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or FIGURES:
        path = os.path.join(args.out, name)
        command = [cli, "bench", *FIGURES[name], "--plot", path]
        print(f"bench-figures: {name}: pycollective bench {' '.join(FIGURES[name])}", flush=True)
        with open(os.path.splitext(path)[0] + ".txt", "w") as log:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            print(
                f"bench-figures: {name} failed (exit {result.returncode}); see "
                f"{os.path.splitext(path)[0]}.txt",
                file=sys.stderr,
            )
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
