"""Accelerate's ``accelerate.commands`` path: the `accelerate` command line, as faces of hasten's `cli/` and `launch/`.

Each module re-exports the names of Accelerate's module of the same path; the code is in `hasten.cli`
(the commands) and `hasten.launch` (config objects, launch helpers).

Example:
    >>> from hasten.commands.launch import launch_command_parser
    >>> launch_command_parser().parse_args(["train.py"]).training_script
    'train.py'
"""
