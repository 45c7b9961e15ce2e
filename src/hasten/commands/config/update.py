"""Accelerate's ``accelerate.commands.config.update`` path: `accelerate config update`.

Example:
    >>> from hasten.commands.config.update import update_config
    >>> update_config.__module__
    'hasten.cli.accelerate_config_command'
"""

from ...cli.accelerate_config_command import update_command_parser, update_config, update_config_command
from ...launch.accelerate_config_file import default_config_file, load_config_from_file

__all__ = ["default_config_file", "load_config_from_file", "update_command_parser", "update_config",
           "update_config_command"]
