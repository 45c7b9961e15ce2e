"""Accelerate's ``accelerate.commands.config.config_args`` path: its config objects; the code is `hasten.launch.accelerate_config_file`.

Example:
    >>> from hasten.commands.config.config_args import ClusterConfig
    >>> ClusterConfig("LOCAL_MACHINE", "NO", "no", True, False).num_processes
    -1
"""

from ...launch.accelerate_config_file import (BaseConfig, ClusterConfig, SageMakerConfig, cache_dir, default_config_file,
                                   default_json_config_file, default_yaml_config_file, hf_cache_home,
                                   load_config_from_file)

__all__ = ["BaseConfig", "ClusterConfig", "SageMakerConfig", "cache_dir", "default_config_file",
           "default_json_config_file", "default_yaml_config_file", "hf_cache_home", "load_config_from_file"]
