"""Accelerate's ``accelerate.commands.utils`` path: the commands' argument parser; the code is `hasten.cli.recording_parser`.

Example:
    >>> from hasten.commands.utils import CustomArgumentParser
    >>> parser = CustomArgumentParser(prog="demo")
    >>> parser.add_argument("--num_processes", type=int)
    >>> parser.parse_args(["--num-processes", "2"]).num_processes
    2
"""

from ..cli.recording_parser import (CustomArgumentGroup, CustomArgumentParser, _StoreAction, _StoreConstAction,
                                _StoreTrueAction)

__all__ = ["CustomArgumentGroup", "CustomArgumentParser", "_StoreAction", "_StoreConstAction", "_StoreTrueAction"]
