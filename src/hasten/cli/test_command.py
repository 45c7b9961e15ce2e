"""`hasten test` (and the peer's `accelerate test`): is my setup working? The self-test on all configured processes."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "test",
        help="run a self-test on every configured process and print one line: passed or what failed",
        description="Runs hasten's self-test script through `hasten launch` with your config. Any launch flag "
                    "(e.g. --num_processes 2 --cpu) may follow and overrides the config file.",
    )
    parser.add_argument("--config_file", "--config-file", default=None, metavar="PATH",
                        help="config file to use (default: the default path)")
    parser.add_argument("launch_flags", nargs=argparse.REMAINDER, metavar="LAUNCH_FLAGS",
                        help="extra `hasten launch` flags")
    parser.set_defaults(run=run, parser=parser, passes_unknown_flags=True)
    return parser


def run(args: argparse.Namespace) -> int:
    """Launch `hasten.cli.selftest` with the config file and launch flags given."""
    from .launch import main as launch

    argv: list[str] = []
    if args.config_file:
        argv += ["--config_file", args.config_file]
    # as a module: run as a path, its folder (hasten/) would come first on sys.path and
    # hasten/logging.py would shadow the standard library's logging
    return launch([*argv, *args.launch_flags, "-m", "hasten.cli.selftest"])


# -- the peer's `accelerate test` -------------------------------------------------------------------------------------
def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `test` parser: alone, or as the `test` sub-command of `subparsers`.

    Example:
        >>> test_command_parser().parse_args([]).config_file is None
        True
    """
    parser = (subparsers.add_parser("test") if subparsers is not None
              else argparse.ArgumentParser("Accelerate test command"))
    parser.add_argument("--config_file", default=None,
                        help="the config file to launch with (default: Accelerate's default file, if there is one)")
    if subparsers is not None:
        parser.set_defaults(func=test_command)
    return parser


def test_command(args: argparse.Namespace) -> None:
    """Launch hasten's self-test as `accelerate launch` would (the config file's processes); say so when it passes."""
    from .launchers import launch_command, launch_command_parser

    argv = [] if args.config_file is None else [f"--config_file={args.config_file}"]
    launch_command(launch_command_parser().parse_args([*argv, "-m", "hasten.cli.selftest"]))
    print("Test is a success! You are ready for your distributed training!")


def main() -> None:
    """`python -m` entry of the peer's command.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    test_command(test_command_parser().parse_args())
