"""Accelerate's ``accelerate.commands.to_fsdp2`` path: `accelerate to-fsdp2`; the code is `hasten.cli.to_fsdp2`.

Example:
    >>> from hasten.commands.to_fsdp2 import convert_config_to_fsdp2
    >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}})["fsdp_config"]
    {'fsdp_reshard_after_forward': True, 'fsdp_version': 2}
"""

from ..cli.to_fsdp2 import (ARGUMENT_KEY_MAPPING, ARGUMENT_VALUE_MAPPING, ConversionStatus, convert_config_to_fsdp2,
                            load_config, logger, main, to_fsdp2_command, to_fsdp2_command_parser)

__all__ = ["ARGUMENT_KEY_MAPPING", "ARGUMENT_VALUE_MAPPING", "ConversionStatus", "convert_config_to_fsdp2",
           "load_config", "logger", "main", "to_fsdp2_command", "to_fsdp2_command_parser"]
