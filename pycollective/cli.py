"""The ``pycollective`` command: one subcommand per tool, dispatched with argparse.

To add a subcommand (``bench``, ``tune``), write a module with ``HELP``,
``add_arguments(parser)`` and ``main(args) -> int``, and add one line to
``_subcommands()``. A tool that parses its own arguments (``main(argv)``) is a forwarded
subcommand: ``_forwarded()`` maps its name to its entry point.

Every tool is reached through this console script rather than ``python -m``, so that it runs the
installed package even from the root of a source checkout (where ``python -m`` would put the
unbuilt source folder first on ``sys.path``).
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
    from . import doctor, launcher, token_cli
    from .bench import cli as bench
    from .bench import tune

    return [
        Subcommand("run", launcher.HELP, launcher.add_arguments, launcher.main),
        Subcommand("bench", bench.HELP, bench.add_arguments, bench.run),
        Subcommand("tune", tune.HELP, tune.add_arguments, tune.main),
        Subcommand("doctor", doctor.HELP, doctor.add_arguments, doctor.main),
        Subcommand("token", token_cli.HELP, token_cli.add_arguments, token_cli.main),
    ]


@dataclass(frozen=True)
class Forwarded:
    """A tool with its own argument parser: ``pycollective NAME ARGS...`` calls
    ``MODULE.FUNCTION(ARGS)`` (``--help`` included)."""

    help: str
    module: str
    function: str = "main"

    def __call__(self, argv: list[str]) -> int:
        import importlib

        result = getattr(importlib.import_module(self.module), self.function)(argv)
        return result if isinstance(result, int) else 0


def _forwarded() -> dict[str, Forwarded]:
    return {
        "bench-strategies": Forwarded(
            "strategy-layer overhead: apply_gradients against the bare all-reduce",
            "pycollective.bench.strategy_bench",
        ),
        "bench-ps": Forwarded(
            "parameter-server pull/push bandwidth and training steps per second",
            "pycollective.bench.ps_bench",
        ),
        "bench-ps-contention": Forwarded(
            "a ps task's pulls and updates meeting over shaped links (root: network namespaces)",
            "pycollective.bench.ps_contention",
        ),
        "bench-tpu": Forwarded(
            "TPUStrategy on forced host devices vs MirroredStrategy; XLA psum vs our allreduce",
            "pycollective.bench.tpu_bench",
        ),
        "bench-torch": Forwarded(
            "torch.distributed all_reduce and DDP steps through 'pycollective' and 'gloo'",
            "pycollective.bench.torch_bench",
        ),
        "bench-model": Forwarded(
            "the cost model's all-reduce estimates for a cluster you do not have (e.g. 64x8)",
            "pycollective.bench.model_table",
        ),
        "bench-compress": Forwarded(
            "bf16/fp16 compressed all-reduce against float32 (run it as every rank of a job)",
            "pycollective.bench.compress_bench",
        ),
        "bench-encrypt": Forwarded(
            "the cost of encrypting the data plane: AES-256-GCM against plaintext over tcp",
            "pycollective.bench.encrypt_bench",
        ),
        "bench-faults": Forwarded(
            "the fault soak: killed, frozen and cut-off ranks, lossy links, protocol fuzzers",
            "pycollective.bench.fault_soak",
        ),
        "bench-netns": Forwarded(
            "every algorithm on a shaped cluster of network namespaces (root)",
            "pycollective.bench.netns_bench",
        ),
        "bench-goals": Forwarded(
            "the speed goals on one host (vs Open MPI, gloo, a TCP stream; auto vs the best), "
            "each with a verdict",
            "pycollective.bench.goals",
        ),
        "bench-figures": Forwarded(
            "remake the pictures in docs/ (each labelled with its command, machine and date)",
            "pycollective.bench.figures",
        ),
        "ps-task": Forwarded(
            "run this process as the ps or worker task its TF_CONFIG names, until SIGTERM",
            "pycollective.strategies.parameter_server.server",
        ),
    }


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="pycollective", description="pycollective command-line tools"
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version, commit and CUDA support, and exit",
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for sub in _subcommands():
        sub_parser = subparsers.add_parser(sub.name, help=sub.help, description=sub.help)
        sub.add_arguments(sub_parser)
        sub_parser.set_defaults(_main=sub.main)
    for name, tool in _forwarded().items():
        # Listed for --help only: main() hands these their arguments untouched.
        subparsers.add_parser(
            name, help=f"{tool.help} (see `pycollective {name} --help`)", add_help=False
        )
    return parser


class _VersionAction(argparse.Action):
    """``--version``: prints ``doctor.version_line()``. Computed only when asked, so that
    ``pycollective --help`` does not load the native extension."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from .doctor import version_line

        print(version_line())
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pycollective`` console script.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    forwarded = _forwarded()
    if argv and argv[0] in forwarded:
        return forwarded[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)
    return args._main(args)


if __name__ == "__main__":
    sys.exit(main())
