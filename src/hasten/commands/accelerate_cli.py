"""Accelerate's ``accelerate.commands.accelerate_cli`` path: the `accelerate` command; the code is `hasten.cli.accelerate_command`.

Example:
    >>> from hasten.commands.accelerate_cli import main
    >>> main.__module__
    'hasten.cli.accelerate_command'
"""

from ..cli.accelerate_command import main

__all__ = ["main"]


if __name__ == "__main__":  # python -m accelerate.commands.accelerate_cli, under the switch
    main()
