"""Accelerate's ``accelerate.commands.env`` path: `accelerate env`; the code is in `hasten.cli.env_command`.

Example:
    >>> from hasten.commands.env import env_command_parser
    >>> env_command_parser().parse_args([]).config_file is None
    True
"""

from ..cli.env_command import env_command, env_command_parser, main, which

__all__ = ["env_command", "env_command_parser", "main", "which"]


if __name__ == "__main__":  # python -m accelerate.commands.env, under the switch
    raise SystemExit(main())
