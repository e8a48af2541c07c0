"""The ``pycollective`` command: one subcommand per tool, dispatched with argparse.

To add a subcommand (``bench``, ``tune``), write a module with ``HELP``,
``add_arguments(parser)`` and ``main(args) -> int``, and add one line to
``_subcommands()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    """One ``pycollective <name>`` tool.

    Attributes:
        name: What the user types after ``pycollective``.
        help: One line for ``pycollective --help``.
        add_arguments: Declares the subcommand's options on its parser.
        main: Runs it with the parsed arguments; returns the exit code.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    main: Callable[[argparse.Namespace], int]


def _subcommands() -> list[Subcommand]:
    # Imported here so that `pycollective --help` stays fast as tools are added.
    from . import launcher
    from .bench import cli as bench
    from .bench import tune

    return [
        Subcommand("run", launcher.HELP, launcher.add_arguments, launcher.main),
        Subcommand("bench", bench.HELP, bench.add_arguments, bench.run),
        Subcommand("tune", tune.HELP, tune.add_arguments, tune.main),
    ]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="pycollective", description="pycollective command-line tools"
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for sub in _subcommands():
        sub_parser = subparsers.add_parser(sub.name, help=sub.help, description=sub.help)
        sub.add_arguments(sub_parser)
        sub_parser.set_defaults(_main=sub.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pycollective`` console script.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit code.
    """
    args = build_parser().parse_args(argv)
    return args._main(args)


if __name__ == "__main__":
    sys.exit(main())
