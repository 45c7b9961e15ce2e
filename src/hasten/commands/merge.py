"""Accelerate's ``accelerate.commands.merge`` path: `accelerate merge-weights`; the code is in `hasten.cli.merge_weights`.

Example:
    >>> from hasten.commands.merge import merge_command_parser
    >>> merge_command_parser().parse_args(["ckpt", "out"]).output_path
    'out'
"""

from ..cli.merge_weights import main, merge_command, merge_command_parser

__all__ = ["main", "merge_command", "merge_command_parser"]


if __name__ == "__main__":  # python -m accelerate.commands.merge, under the switch
    main()
