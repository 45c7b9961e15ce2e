"""Accelerate's ``accelerate.commands.config.default`` path: `accelerate config default` and `write_basic_config`.

Example:
    >>> from hasten.commands.config.default import write_basic_config
    >>> write_basic_config.__module__
    'hasten.cli.basic_config'
"""

from ...cli.basic_config import write_basic_config
from ...cli.accelerate_config_command import SubcommandHelpFormatter, default_command_parser, default_config_command
from ...launch.accelerate_config_file import ClusterConfig, default_json_config_file

__all__ = ["ClusterConfig", "SubcommandHelpFormatter", "default_command_parser", "default_config_command",
           "default_json_config_file", "write_basic_config"]
