"""`hasten test`: is my setup working? Runs hasten's self-test on all configured processes."""

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
