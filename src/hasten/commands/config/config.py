"""Accelerate's ``accelerate.commands.config.config`` path: the questionnaire; the code is `hasten.cli.accelerate_config_command`.

Example:
    >>> from hasten.commands.config.config import config_command_parser
    >>> config_command_parser().parse_args([]).config_file is None
    True
"""

from ...cli.accelerate_config_command import config_command, config_command_parser, get_user_input, main
from ...launch.accelerate_config_file import cache_dir, default_config_file, default_yaml_config_file, load_config_from_file

__all__ = ["cache_dir", "config_command", "config_command_parser", "default_config_file", "default_yaml_config_file",
           "get_user_input", "load_config_from_file", "main"]


if __name__ == "__main__":  # python -m accelerate.commands.config.config, under the switch
    main()
