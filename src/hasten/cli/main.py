"""`hasten` entry point: dispatches to sub-commands."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import config_command, env_command, estimate_memory, launch as launch_command, merge_weights, test_command


class ConciseParser(argparse.ArgumentParser):
    """Bad flags get one sentence and a pointer to --help, not the whole usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `hasten` command; returns the process exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    if unknown and getattr(args, "passes_unknown_flags", False):
        args.launch_flags = [*unknown, *args.launch_flags]
    elif unknown:  # flags placed before the script that the sub-command does not know
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except BrokenPipeError:  # e.g. `hasten env | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
