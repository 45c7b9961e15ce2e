"""`hasten` entry point: dispatches to sub-commands."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import config_command, env_command, estimate_memory, launch as launch_command, merge_weights, test_command
from . import to_fsdp2
from .parsing import ConciseParser, run_command

__all__ = ["ConciseParser", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The `hasten` parser with every sub-command.

    Example:
        >>> build_parser().parse_args(["env"]).command
        'env'
    """
    parser = ConciseParser(
        prog="hasten",
        description="Run one unchanged PyTorch training loop on 1 or N processes.",
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ConciseParser)
    config_command.add_parser(commands)
    launch_command.add_parser(commands)
    env_command.add_parser(commands)
    test_command.add_parser(commands)
    merge_weights.add_parser(commands)
    estimate_memory.add_parser(commands)
    to_fsdp2.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `hasten` command; returns the process exit code.

    Example:
        >>> main([])  # doctest: +ELLIPSIS
        usage: hasten [-h] [--version] COMMAND ...
        ...
        2
    """
    return run_command(build_parser(), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
