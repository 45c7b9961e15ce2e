"""The peer's ``accelerate.utils.launch`` path: `PrepareForLaunch` and Accelerate's launch helpers.

The code lives in `hasten.launch.forked` (`PrepareForLaunch`), `hasten.cli.launcher_env` (what each of
`accelerate launch`'s launchers runs and exports) and `hasten.launch.sagemaker`. `which` and `subprocess`
are here as in Accelerate's module, where tests patch them (the accelerate switch carries such a patch to
the code that looks them up).

Example:
    >>> from hasten.utils.launch import PrepareForLaunch
    >>> PrepareForLaunch.__name__
    'PrepareForLaunch'
"""

from ..launch.forked import PrepareForLaunch
from ..launch.accelerate_config_file import SageMakerConfig
from ..cli.launcher_env import (DEEPSPEED_MULTINODE_LAUNCHERS, _filter_args, _get_mpirun_args, env_var_path_add,
                            prepare_deepspeed_cmd_env, prepare_extend_env_parallelism_config, prepare_multi_gpu_env,
                            prepare_simple_launcher_cmd_env, prepare_tpu, setup_fp8_env, subprocess, which)
from ..launch.sagemaker import _convert_nargs_to_dict, prepare_sagemager_args_inputs

__all__ = ["DEEPSPEED_MULTINODE_LAUNCHERS", "PrepareForLaunch", "SageMakerConfig", "_convert_nargs_to_dict",
           "_filter_args", "_get_mpirun_args", "env_var_path_add", "prepare_deepspeed_cmd_env",
           "prepare_extend_env_parallelism_config", "prepare_multi_gpu_env", "prepare_sagemager_args_inputs",
           "prepare_simple_launcher_cmd_env", "prepare_tpu", "setup_fp8_env", "subprocess", "which"]
