"""Accelerate's ``accelerate.commands.config.sagemaker`` path: SageMaker's questions, refused (hasten starts no SageMaker job).

Example:
    >>> from hasten.commands.config.sagemaker import get_sagemaker_input
    >>> get_sagemaker_input.__module__
    'hasten.cli.accelerate_config_command'
"""

from ...cli.accelerate_config_command import get_sagemaker_input

__all__ = ["get_sagemaker_input"]
