"""Accelerate's ``accelerate.commands.launch`` path: `accelerate launch`; the code is `hasten.cli.launchers`.

Example:
    >>> from hasten.commands.launch import launch_command_parser
    >>> launch_command_parser().parse_args(["--num-processes", "2", "train.py"]).num_processes
    2
"""

from ..cli.launchers import (CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS, _validate_launch_command,
                             deepspeed_launcher, launch_command, launch_command_parser, logger, main,
                             multi_gpu_launcher, psutil, sagemaker_launcher, simple_launcher, tpu_launcher,
                             tpu_pod_launcher)
from ..launch.gpus import check_cuda_p2p_ib_support
from ..cli.launch_flags import clean_option
from ..cli.recording_parser import CustomHelpFormatter
from ..cli.launcher_env import (prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env,
                            prepare_tpu)

__all__ = ["CHILD_STDERR_CHUNK_SIZE", "CHILD_STDERR_TAIL_CHUNKS", "check_cuda_p2p_ib_support", "psutil",
           "CustomHelpFormatter", "_validate_launch_command", "clean_option", "deepspeed_launcher", "launch_command",
           "launch_command_parser", "logger", "main", "multi_gpu_launcher", "prepare_deepspeed_cmd_env",
           "prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env", "prepare_tpu", "sagemaker_launcher",
           "simple_launcher", "tpu_launcher", "tpu_pod_launcher"]


if __name__ == "__main__":  # python -m accelerate.commands.launch, under the switch
    main()
