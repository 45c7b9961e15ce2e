"""The peer's ``accelerate.utils.environment`` path: names only; the code lives in `hasten.core.environment`
(and `hasten.launch.gpus` for the fp8 capability check, asked of nvidia-smi).

Example:
    >>> import os
    >>> from hasten.utils.environment import patch_environment
    >>> with patch_environment(my_setting="1"):
    ...     os.environ["MY_SETTING"]
    '1'
"""

from ..launch.gpus import check_cuda_fp8_capability
from ..core.environment import (
    CPUInformation,
    are_libraries_initialized,
    get_cpu_distributed_information,
    get_current_device_type,
    clear_environment,
    convert_dict_to_env_variables,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)

__all__ = ["CPUInformation", "are_libraries_initialized", "get_cpu_distributed_information", "get_current_device_type",
           "check_cuda_fp8_capability", "clear_environment", "convert_dict_to_env_variables", "get_int_from_env",
           "parse_choice_from_env", "parse_flag_from_env", "patch_environment", "purge_accelerate_environment",
           "str_to_bool"]
