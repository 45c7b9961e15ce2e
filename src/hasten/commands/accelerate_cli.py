"""Accelerate's ``accelerate.commands.accelerate_cli`` path: the `accelerate` command; the code is `hasten.cli.peer_cli`.

Example:
    >>> from hasten.commands.accelerate_cli import main
    >>> main.__module__
    'hasten.cli.peer_cli'
"""

from ..cli.peer_cli import main

__all__ = ["main"]


if __name__ == "__main__":  # python -m accelerate.commands.accelerate_cli, under the switch
    main()
