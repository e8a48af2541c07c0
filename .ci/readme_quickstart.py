"""Runs the README's quick-start commands verbatim, from the repository root, as a newcomer types
them: each line of the first fenced block under "## Quick start", comments stripped, in bash.

The test command is the exception: .ci/run runs it itself, last, as CI's contract requires. This
script only checks that the README still shows exactly that command (--test-command), so the two
cannot drift apart; every other quick-start line runs here, whatever it becomes.

Usage: python .ci/readme_quickstart.py --test-command 'pip install ".[test]" && pytest'
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the first ```bash block after the "## Quick start" heading."""
    section = readme.split("## Quick start", 1)
    if len(section) != 2:
        raise SystemExit("README.md has no '## Quick start' section")
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section[1], re.S)
    if block is None:
        raise SystemExit("README.md's quick start has no fenced code block")
    commands = []
    for line in block.group(1).splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment, not a '#' in a word
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--test-command",
        required=True,
        help="the test command .ci/run runs itself; must be in the quick start",
    )
    args = parser.parse_args()
    commands = quick_start_commands((ROOT / "README.md").read_text())
    if args.test_command not in commands:
        print(
            f"readme-quickstart: the README's quick start no longer shows the test command "
            f"{args.test_command!r} that .ci/run runs; it shows {commands}",
            file=sys.stderr,
        )
        return 1
    for command in commands:
        if command == args.test_command:
            continue
        print(f"readme-quickstart: $ {command}", flush=True)
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT)
        if result.returncode != 0:
            print(f"readme-quickstart: exit {result.returncode} from {command!r}", file=sys.stderr)
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
