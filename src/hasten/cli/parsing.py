"""What every `hasten` sub-command shares: the concise parser and the dispatch of parsed arguments."""

from __future__ import annotations

import argparse
import sys

__all__ = ["ConciseParser", "run_command"]


class ConciseParser(argparse.ArgumentParser):
    """Bad flags get one sentence and a pointer to --help, not the whole usage block.

    Example:
        >>> ConciseParser(prog="hasten").prog
        'hasten'
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def run_command(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse `argv` with a parser of sub-commands and run the chosen one; returns the process exit code.

    Example:
        >>> parser = ConciseParser(prog="hasten")
        >>> _ = parser.add_subparsers(dest="command")
        >>> run_command(parser, [])  # doctest: +ELLIPSIS
        usage: hasten ...
        2
    """
    args, unknown = parser.parse_known_args(argv)
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
