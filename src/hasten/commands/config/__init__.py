"""Accelerate's ``accelerate.commands.config`` path: `accelerate config`; the code is `hasten.cli.accelerate_config_command`.

Example:
    >>> from hasten.commands.config import default_config_file
    >>> default_config_file.endswith("default_config.yaml")
    True
"""

from ...cli.accelerate_config_command import get_config_parser, main
from ...launch.accelerate_config_file import default_config_file, load_config_from_file

__all__ = ["default_config_file", "get_config_parser", "load_config_from_file", "main"]
