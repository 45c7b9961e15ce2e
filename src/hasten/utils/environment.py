"""The peer's ``accelerate.utils.environment`` path: names only; the code lives in `hasten.core.environment`
(`hasten.launch.gpus` for the GPU facts asked of nvidia-smi, `hasten.process.affinity` for NUMA pinning).

Example:
    >>> import os
    >>> from hasten.utils.environment import patch_environment
    >>> with patch_environment(my_setting="1"):
    ...     os.environ["MY_SETTING"]
    '1'
"""

from ..launch.gpus import check_cuda_fp8_capability, check_cuda_p2p_ib_support, get_driver_version, get_gpu_info
from ..process.affinity import override_numa_affinity, set_numa_affinity
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
           "str_to_bool", "check_cuda_p2p_ib_support", "get_driver_version", "get_gpu_info", "override_numa_affinity",
           "set_numa_affinity"]
