"""Accelerate's `accelerate launch` (``accelerate.commands.launch``), run by hasten's launcher.

`_validate_launch_command` fills a parsed namespace as Accelerate's does —
the config file (Accelerate's default one when none is given) supplies
what the command line left out, the command line wins, and what neither
gives gets Accelerate's defaults (with the same warning) — and
`launch_command` picks Accelerate's launcher for it: DeepSpeed, torchrun
(several GPUs, FSDP) or the simple one (one process, or mpirun). Each then
starts the processes through hasten's launch path (`launch.plan` ->
`launch.run`: rank-labelled failures, no process left behind), with the
launch spec and Accelerate's variables `launch.launcher_env` derives. A failed
run raises `subprocess.CalledProcessError` (with `--quiet`: exits 1), as the
simple launcher of Accelerate does. TPU, SageMaker and Megatron-LM runs are
refused in one sentence: hasten has none of them.

The processes run with the accelerate switch on: `import accelerate` in the
script gets hasten.

Example:
    >>> args = launch_command_parser().parse_args(["--cpu", "--num_processes", "1", "train.py"])
    >>> args, defaults, from_config = _validate_launch_command(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from typing import Any

from ..core.environment import get_int_from_env
from ..launch.accelerate_config_file import ClusterConfig, SageMakerConfig, default_config_file, load_config_from_file
from ..launch.launcher_env import launcher_env, prepare_deepspeed_cmd_env, spec_from_args
from ..options.enums import ComputeEnvironment, DistributedType
from ..process.aliasing import SITE_DIRECTORY
from ..process.launch_spec import AS_ACCELERATE_ENV
from .launch_flags import DESCRIPTION, add_launch_arguments
from .recording_parser import CustomArgumentParser, CustomHelpFormatter

__all__ = ["launch_command_parser", "_validate_launch_command", "launch_command", "simple_launcher",
           "multi_gpu_launcher", "deepspeed_launcher", "tpu_launcher", "tpu_pod_launcher", "sagemaker_launcher", "main"]

logger = logging.getLogger(__name__)

# Accelerate's distributed types that mean "one process per device" (torchrun).
_MULTI_DEVICE = (DistributedType.MULTI_GPU, DistributedType.MULTI_NPU, DistributedType.MULTI_MLU,
                 DistributedType.MULTI_SDAA, DistributedType.MULTI_MUSA, DistributedType.MULTI_XPU,
                 DistributedType.MULTI_HPU, DistributedType.MULTI_NEURON)
# a config section -> (the start its keys may already have, the prefix their launch options add otherwise)
_SECTION_PREFIXES = {"fsdp_config": ("fsdp", "fsdp_"), "fp8_config": ("fp8", "fp8_"),
                     "dynamo_config": ("dynamo_", "dynamo_")}


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `launch` parser: alone, or as the `launch` sub-command of `subparsers`.

    Example:
        >>> launch_command_parser().parse_args(["train.py"]).fsdp_sync_module_states
        'true'
    """
    options: dict[str, Any] = {"description": DESCRIPTION, "add_help": False, "allow_abbrev": False,
                               "formatter_class": CustomHelpFormatter}
    parser: Any = (subparsers.add_parser("launch", **options) if subparsers is not None
                   else CustomArgumentParser("Accelerate launch command", **options))
    add_launch_arguments(parser)
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def _device_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return int(xpu.device_count())
    return int(torch.cuda.device_count())


def _from_config(args: argparse.Namespace, defaults: ClusterConfig | SageMakerConfig) -> bool:
    """Fill `args` from the config file as Accelerate does; True when the precision came from the file."""
    if not any(getattr(args, name, False) for name in ("multi_gpu", "tpu", "tpu_use_cluster", "use_deepspeed",
                                                       "use_fsdp", "use_megatron_lm")):
        kind = defaults.distributed_type
        args.use_deepspeed = kind == DistributedType.DEEPSPEED
        args.multi_gpu = kind in _MULTI_DEVICE
        args.tpu = kind == DistributedType.XLA
        args.use_fsdp = kind == DistributedType.FSDP
        args.use_megatron_lm = kind == DistributedType.MEGATRON_LM
        args.tpu_use_cluster = getattr(defaults, "tpu_use_cluster", False) if args.tpu else False
        args.use_parallelism_config = bool(getattr(defaults, "parallelism_config", {}))
    if args.gpu_ids is None:
        args.gpu_ids = defaults.gpu_ids if defaults.gpu_ids is not None else "all"
    if args.multi_gpu and args.num_machines is None:
        args.num_machines = defaults.num_machines
    if args.gpu_ids != "all" and len(args.gpu_ids.split(",")) < 2 and args.multi_gpu and args.num_machines <= 1:
        raise ValueError("Less than two GPU ids were configured for a run on multiple GPUs; give at least two in "
                         "--gpu_ids, or --gpu_ids all.")
    if defaults.compute_environment == ComputeEnvironment.LOCAL_MACHINE:
        given = getattr(args, "nondefault", None)  # what the command line set wins over the file
        for name, value in defaults.__dict__.items():
            if isinstance(value, dict):
                start, prefix = _SECTION_PREFIXES.get(name, ("", ""))
                for key, item in value.items():
                    if not key.startswith(start):
                        key = prefix + key
                    if given is not None and key not in given:
                        setattr(args, key, item)
            elif name not in ("compute_environment", "mixed_precision", "distributed_type") \
                    and getattr(args, name, None) is None:
                setattr(args, name, value)
    if not args.debug:
        args.debug = defaults.debug
    from_config = False
    if not args.mixed_precision:
        args.mixed_precision = "no" if defaults.mixed_precision is None else defaults.mixed_precision
        from_config = defaults.mixed_precision is not None
    elif args.mixed_precision == "bf16":
        from ..core.availability import is_bf16_available

        if not is_bf16_available(True):
            raise ValueError("bf16 mixed precision needs a device that supports it; use --mixed_precision fp16 or no.")
    if args.dynamo_backend is None:
        args.dynamo_backend = "no"
    if args.num_processes == -1:
        raise ValueError("This config file leaves num_processes to the launch (-1); pass --num_processes.")
    return from_config


def _without_config(args: argparse.Namespace, warned: list[str]) -> None:
    """Accelerate's defaults for what neither the command line nor a config file gave (each one noted)."""
    if args.num_processes is None:
        args.num_processes = _device_count()
        warned.append(f"\t`--num_processes` was set to a value of `{args.num_processes}`")
    if args.debug is None:
        args.debug = False
    if not args.multi_gpu and args.num_processes > 1 and _device_count() > 1:
        warned.append("\t\tMore than one GPU was found, enabling multi-GPU training.\n"
                      "\t\tIf this was unintended please pass in `--num_processes=1`.")
        args.multi_gpu = True
    if args.num_machines is None:
        warned.append("\t`--num_machines` was set to a value of `1`")
        args.num_machines = 1
    if args.mixed_precision is None:
        warned.append("\t`--mixed_precision` was set to a value of `'no'`")
        args.mixed_precision = "no"
    if not hasattr(args, "use_cpu"):
        args.use_cpu = args.cpu
    if args.dynamo_backend is None:
        warned.append("\t`--dynamo_backend` was set to a value of `'no'`")
        args.dynamo_backend = "no"


def _thread_count(args: argparse.Namespace, warned: list[str]) -> None:
    """Accelerate's OMP_NUM_THREADS choice: the environment's, else 1; on CPUs, each local process's share of the cores."""
    args.num_cpu_threads_per_process = get_int_from_env(["OMP_NUM_THREADS"], 1)
    if args.use_cpu and args.num_processes >= 1 and get_int_from_env(["OMP_NUM_THREADS"], 0) == 0:
        local = get_int_from_env(["MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"],
                                 max(int(args.num_processes / args.num_machines), 1))
        import psutil

        threads = int((psutil.cpu_count(logical=False) or 1) / local)
        if threads > 1:
            args.num_cpu_threads_per_process = threads
            warned.append(f"\t`--num_cpu_threads_per_process` was set to `{threads}` to improve out-of-box "
                          "performance when training on CPUs")


def _validate_launch_command(
        args: argparse.Namespace) -> tuple[argparse.Namespace, ClusterConfig | SageMakerConfig | None, bool]:
    """Check a parsed `accelerate launch` and fill it from the config file and Accelerate's defaults.

    Returns the namespace, the config read (None when there was none) and
    whether the mixed precision came from it.

    Example:
        >>> args = launch_command_parser().parse_args(["--cpu", "--multi_gpu", "train.py"])
        >>> _validate_launch_command(args)
        Traceback (most recent call last):
        ...
        ValueError: You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, `--use_deepspeed`, `--use_fsdp` at a time; keep one.
    """
    if sum(bool(getattr(args, name)) for name in ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp")) > 1:
        raise ValueError("You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, `--use_deepspeed`, `--use_fsdp` "
                         "at a time; keep one.")
    if args.multi_gpu and args.num_processes is not None and args.num_processes < 2:
        raise ValueError("`--multi_gpu` needs at least 2 processes; raise --num_processes or drop --multi_gpu.")
    if (not args.use_fsdp or args.fsdp_version == 1) and args.use_parallelism_config:
        raise ValueError("`--use_parallelism_config` needs `--use_fsdp` and `--fsdp_version=2`; add them.")
    defaults = None
    warned: list[str] = []
    from_config = False
    if args.config_file is not None or (os.path.isfile(default_config_file) and not args.cpu):
        defaults = load_config_from_file(args.config_file)
        from_config = _from_config(args, defaults)
    else:
        _without_config(args, warned)
    if args.debug:
        logger.debug("Running the script in debug mode: distributed operations are checked, and slightly slower.")
    if (defaults is None or defaults.compute_environment != ComputeEnvironment.AMAZON_SAGEMAKER) \
            and args.num_cpu_threads_per_process is None:
        _thread_count(args, warned)
    if warned:
        logger.warning("The following values were not passed to `accelerate launch` and had defaults used instead:\n"
                       + "\n".join(warned) + "\nTo avoid this warning pass in values for each of the problematic "
                       "parameters or run `accelerate config`.")
    return args, defaults, from_config


# ------------------------------------------------------------------------------------------- launchers
def _switch_env() -> dict[str, str]:
    """The accelerate switch in every process: Accelerate scripts import `accelerate` and get hasten."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIRECTORY]
    return {AS_ACCELERATE_ENV: "1", "PYTHONPATH": os.pathsep.join([SITE_DIRECTORY, *paths])}


def _refuse_no_python(args: argparse.Namespace) -> None:
    if getattr(args, "no_python", False):
        raise ValueError("--no_python: hasten's launcher runs Python scripts and modules; drop --no_python and "
                         "pass the script (or -m module).")


def _port(args: argparse.Namespace) -> int | None:
    """Accelerate's port rule on hasten's plan: 0 -> a free one; none given -> 29500, or a free one if that is taken."""
    from ..launch.plan import DEFAULT_MULTI_NODE_PORT, port_in_use

    port = args.main_process_port
    if port == 0:
        return None
    if port is None:
        taken = args.num_machines <= 1 and port_in_use(DEFAULT_MULTI_NODE_PORT, args.main_process_ip or "127.0.0.1")
        return None if taken else DEFAULT_MULTI_NODE_PORT
    return int(port)


def _run(args: argparse.Namespace, **plan_settings: Any) -> None:
    """Start the plan's processes through hasten's launcher; a failed run raises as Accelerate's launcher does."""
    from ..launch.plan import LaunchPlan
    from ..launch.run import execute

    _refuse_no_python(args)
    spec = plan_settings.pop("spec")
    extra = {**launcher_env(args, spec), **_switch_env(), **plan_settings.pop("extra_env", {})}
    plan = LaunchPlan(target=args.training_script, target_args=tuple(args.training_script_args or ()),
                      module=bool(args.module), gpu_ids=str(args.gpu_ids or "all"), quiet=bool(args.quiet),
                      spec=spec, extra_env=extra, in_this_process=False, **plan_settings).validate()
    code = execute(plan)
    if code != 0:
        if args.quiet:
            sys.exit(1)
        raise subprocess.CalledProcessError(returncode=code, cmd=plan.command())


def simple_launcher(args: argparse.Namespace) -> None:
    """One Python process running the script (mpirun's N with `--mpirun_hostfile`)."""
    spec = spec_from_args(args, "simple")
    if args.mpirun_hostfile is None:
        extra = {}
        if (args.num_processes or 0) > 1 or args.num_machines > 1:  # as Accelerate: the rendezvous is announced
            extra = {"MASTER_ADDR": args.main_process_ip or "127.0.0.1",
                     "MASTER_PORT": str(args.main_process_port if args.main_process_port is not None else 29500)}
        _run(args, spec=spec, extra_env=extra)
        return
    _run(args, spec=spec, num_processes=int(args.num_processes or 1), mpirun=True,
         mpirun_hostfile=args.mpirun_hostfile, main_process_ip=args.main_process_ip,
         main_process_port=args.main_process_port)


def _torchrun_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"num_processes": int(args.num_processes), "num_machines": int(args.num_machines),
            "machine_rank": int(args.machine_rank or 0), "main_process_ip": args.main_process_ip,
            "main_process_port": _port(args), "rdzv_backend": args.rdzv_backend or "static",
            "max_restarts": int(args.max_restarts or 0), "monitor_interval": float(args.monitor_interval)}


def _refuse_torchrun_only(args: argparse.Namespace) -> None:
    unsupported = [flag for flag, value, default in (("--log_dir", args.log_dir, None), ("--rdzv_conf", args.rdzv_conf, ""),
                                                     ("--role", args.role, "default"))
                   if value not in (default, None)]
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)}: torchrun options hasten's launcher does not take; drop them "
                         "(hasten writes its own logs and failure records).")


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """One process per device through torchrun (also FSDP's launcher)."""
    _refuse_torchrun_only(args)
    _run(args, spec=spec_from_args(args, "multi_gpu"), **_torchrun_settings(args))


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """DeepSpeed's run: torchrun on one machine (or with the standard launcher), else DeepSpeed's own launcher."""
    from importlib.util import find_spec

    if find_spec("deepspeed") is None:
        raise ImportError("DeepSpeed is not installed; pip install deepspeed (or build it from source).")
    _refuse_torchrun_only(args)
    if args.num_machines > 1 and (args.deepspeed_multinode_launcher or "pdsh") != "standard":
        _refuse_no_python(args)
        cmd, env = prepare_deepspeed_cmd_env(args)
        env.update(_switch_env())
        assert cmd is not None  # several machines, not the standard launcher: DeepSpeed's own command
        process = subprocess.run(cmd, env=env)
        if process.returncode != 0:
            if args.quiet:
                sys.exit(1)
            raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
        return
    from ..launch.launcher_env import env_var_path_add

    _run(args, spec=spec_from_args(args, "deepspeed"), **_torchrun_settings(args),
         extra_env={"PYTHONPATH": env_var_path_add("PYTHONPATH", os.path.abspath("."))})


def tpu_launcher(args: argparse.Namespace) -> None:
    """Refused: hasten has no TPU support."""
    raise NotImplementedError("--tpu: hasten has no TPU (torch_xla) support; run on GPUs or CPUs instead.")


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Refused: hasten has no TPU support."""
    tpu_launcher(args)


def sagemaker_launcher(sagemaker_config: SageMakerConfig, args: argparse.Namespace) -> None:
    """Refused: hasten starts no Amazon SageMaker job."""
    from ..launch.sagemaker import prepare_sagemager_args_inputs

    prepare_sagemager_args_inputs(sagemaker_config, args)


def launch_command(args: argparse.Namespace) -> None:
    """Run a parsed `accelerate launch`: validate it, then start it with Accelerate's choice of launcher.

    Example:
        >>> launch_command(launch_command_parser().parse_args(["--tpu", "train.py"]))  # doctest: +SKIP
        Traceback (most recent call last):
        ...
        NotImplementedError: --tpu: hasten has no TPU (torch_xla) support; run on GPUs or CPUs instead.
    """
    args, defaults, precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed and not args.cpu:
        fields = list(defaults.deepspeed_config or {}) if isinstance(defaults, ClusterConfig) else []
        if precision_from_config:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        deepspeed_launcher(args)
    elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu:
        multi_gpu_launcher(args)
    elif args.tpu and not args.cpu:
        tpu_pod_launcher(args) if args.tpu_use_cluster else tpu_launcher(args)
    elif defaults is not None and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
        sagemaker_launcher(defaults, args)  # type: ignore[arg-type]
    else:
        simple_launcher(args)


def main() -> None:
    """`accelerate-launch ARGS`: parse the command line and launch.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    launch_command(launch_command_parser().parse_args())
