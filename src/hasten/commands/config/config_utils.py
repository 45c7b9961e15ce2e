"""Accelerate's ``accelerate.commands.config.config_utils`` path: the compile backends offered, the sub-command help.

Example:
    >>> from hasten.commands.config.config_utils import DYNAMO_BACKENDS
    >>> "INDUCTOR" in DYNAMO_BACKENDS
    True
"""

from ...cli.accelerate_config_command import SubcommandHelpFormatter
from ...cli.launch_flags import DYNAMO_BACKENDS

__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]
