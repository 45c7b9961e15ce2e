"""Accelerate's ``accelerate.commands.config.cluster`` path: the questions about this machine (`hasten config`'s).

Example:
    >>> from hasten.commands.config.cluster import get_cluster_input
    >>> get_cluster_input.__module__
    'hasten.cli.accelerate_config_command'
"""

from ...cli.accelerate_config_command import get_cluster_input

__all__ = ["get_cluster_input"]
