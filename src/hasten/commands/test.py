"""Accelerate's ``accelerate.commands.test`` path: `accelerate test`; the code is in `hasten.cli.test_command`.

Example:
    >>> from hasten.commands.test import test_command_parser
    >>> test_command_parser().parse_args(["--config_file", "c.yaml"]).config_file
    'c.yaml'
"""

from ..cli.test_command import main, test_command, test_command_parser

__all__ = ["main", "test_command", "test_command_parser"]


if __name__ == "__main__":  # python -m accelerate.commands.test, under the switch
    main()
