"""``pycollective token``: the one-time setup for launchers that carry no secret (srun and mpirun
across hosts). ``--create`` writes a fresh random token readable by this user alone; without
options it says where the file is and whether it is usable. It never prints the token."""

from __future__ import annotations

import argparse
import os
import sys

from pycollective.rendezvous.token_file import (
    create_token_file,
    describe_token_file,
)

HELP = "create or check the per-user cluster token file (one-time setup for srun/mpirun)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--create",
        action="store_true",
        help="write a fresh random token to ~/.config/pycollective/token "
        "(or PYCOLLECTIVE_TOKEN_FILE), mode 0600",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --create: overwrite an existing token (running jobs keep the old one)",
    )


def main(args: argparse.Namespace) -> int:
    if args.replace and not args.create:
        print("pycollective token: --replace goes with --create", file=sys.stderr)
        return 2
    if args.create:
        try:
            path = create_token_file(os.environ, replace=args.replace)
        except (ValueError, OSError) as exc:
            print(f"pycollective token: {exc}", file=sys.stderr)
            return 1
        print(f"wrote a new cluster token to {path} (mode 0600)")
        return 0
    line = describe_token_file(os.environ)
    print(line)
    return 1 if line.startswith("token file unusable") else 0
