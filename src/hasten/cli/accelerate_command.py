"""The `accelerate` command (``accelerate.commands.accelerate_cli``), served by hasten.

With the accelerate switch on, Accelerate's console scripts (`accelerate`,
`accelerate-launch`) import this: `accelerate launch`, `config`, `env`,
`estimate-memory`, `merge-weights`, `test`, `to-fsdp2` and `tpu-config` keep
Accelerate's flags and meaning, run by hasten. The `hasten` command
(`cli/main.py`) is hasten's own.

Example:
    >>> build_accelerate_parser().parse_args(["env"]).func.__name__
    'env_command'
"""

from __future__ import annotations

import argparse

from .env_command import env_command_parser
from .hub_estimate import estimate_command_parser
from .merge_weights import merge_command_parser
from .accelerate_config_command import get_config_parser
from .launchers import launch_command_parser
from .recording_parser import CustomArgumentParser
from .test_command import test_command_parser
from .to_fsdp2 import to_fsdp2_command_parser
from .tpu_config import tpu_command_parser

__all__ = ["build_accelerate_parser", "main"]


def build_accelerate_parser() -> argparse.ArgumentParser:
    """The `accelerate` parser with every sub-command (each sets `func`, the function that runs it)."""
    parser = CustomArgumentParser("Accelerate CLI tool", usage="accelerate <command> [<args>]", allow_abbrev=False)
    subparsers = parser.add_subparsers(help="accelerate command helpers")
    for register in (get_config_parser, estimate_command_parser, env_command_parser, launch_command_parser,
                     merge_command_parser, tpu_command_parser, test_command_parser, to_fsdp2_command_parser):
        register(subparsers=subparsers)
    return parser


def main() -> None:
    """`accelerate COMMAND ...`: run the sub-command; without one, print the help and exit 1.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    parser = build_accelerate_parser()
    args = parser.parse_args()
    if not hasattr(args, "func"):
        parser.print_help()
        raise SystemExit(1)
    args.func(args)
