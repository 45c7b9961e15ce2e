"""Accelerate's ``accelerate.commands.tpu`` path: `accelerate tpu-config`; the code is in `hasten.cli.tpu_config`.

Example:
    >>> from hasten.commands.tpu import tpu_command_parser
    >>> tpu_command_parser().parse_args(["--command", "ls"]).command
    [['ls']]
"""

from ..cli.tpu_config import main, tpu_command_launcher, tpu_command_parser

__all__ = ["main", "tpu_command_launcher", "tpu_command_parser"]
