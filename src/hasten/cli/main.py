"""`hasten` entry point: dispatches to sub-commands."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import launch as launch_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hasten",
        description="Run one unchanged PyTorch training loop on 1 or N processes.",
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    launch_command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `hasten` command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args, parser)


if __name__ == "__main__":
    raise SystemExit(main())
