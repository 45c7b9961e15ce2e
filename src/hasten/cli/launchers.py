"""`accelerate launch` (``accelerate.commands.launch``): the launch command under Accelerate's names.

It is `hasten launch` — the same flags (`launch_flags`), the same
resolution of flags and config file (`launch_settings`), the same plan
(`launch_build`) carried out by hasten's launch path (`launch.plan` ->
`launch.run`) — presented as Accelerate presents it:

- `_validate_launch_command` leaves the resolved settings on the namespace
  under Accelerate's names and returns Accelerate's config object, logging
  Accelerate's warning for the values that fell back to defaults;
- `launch_command` picks Accelerate's launcher by name (DeepSpeed, torchrun
  for several GPUs or FSDP, the simple one), each of which starts the one
  plan; a one-process run is a child process, not this one;
- the accelerate switch is on in every process (`import accelerate` gets hasten);
- a one-process run's child writes its stderr through, and the last 512 KiB
  of it go with the error (`hasten.launch.child`);
- a failed run raises `subprocess.CalledProcessError` (with `--quiet`: exits 1);
- Ctrl-C / SIGTERM stop every process the run started, and the launcher exits
  130 / 128 + the signal (as Accelerate 1.16's);
- TPU, SageMaker and Megatron-LM runs are refused in one sentence.

Example:
    >>> args = launch_command_parser().parse_args(["--cpu", "--num_processes", "1", "train.py"])
    >>> args, defaults, from_config = _validate_launch_command(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from typing import Any

import psutil  # noqa: F401  (Accelerate's module has it: tests patch `accelerate.commands.launch.psutil.Popen`)

from ..launch.accelerate_config_file import ClusterConfig, SageMakerConfig, config_object
from ..launch.child import CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS
from .launch_build import build_plan, deepspeed_runs_itself, print_notes, switch_env
from .launch_flags import DESCRIPTION, add_launch_arguments
from .launch_settings import ResolvedLaunch, namespace_view, resolve_config
from .launcher_env import run_deepspeed_itself
from .recording_parser import CustomArgumentParser, CustomHelpFormatter

__all__ = ["launch_command_parser", "_validate_launch_command", "launch_command", "simple_launcher",
           "multi_gpu_launcher", "deepspeed_launcher", "tpu_launcher", "tpu_pod_launcher", "sagemaker_launcher", "main",
           "CHILD_STDERR_CHUNK_SIZE", "CHILD_STDERR_TAIL_CHUNKS", "psutil"]

logger = logging.getLogger(__name__)
_RESOLVED = "_launch_settings"  # the namespace attribute that keeps what `_validate_launch_command` resolved


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The launch command's parser under Accelerate's name: alone, or as the `launch` sub-command of `subparsers`.

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


def _validate_launch_command(
        args: argparse.Namespace) -> tuple[argparse.Namespace, ClusterConfig | SageMakerConfig | None, bool]:
    """Resolve a parsed launch (flags given > config file > defaults) and leave the settings on `args`.

    Returns the namespace, Accelerate's object for the config file read
    (None when there was none) and whether the mixed precision came from it.

    Example:
        >>> args = launch_command_parser().parse_args(["--cpu", "--multi_gpu", "train.py"])
        >>> _validate_launch_command(args)
        Traceback (most recent call last):
        ...
        hasten.core.errors.ConfigError: --cpu and --multi_gpu exclude each other: keep one of them.
    """
    resolved = resolve_config(args)
    namespace_view(resolved, args)
    setattr(args, _RESOLVED, resolved)
    if resolved.defaulted and not getattr(args, "quiet", False):
        lines = [f"\t`--{name}` was set to a value of `{value!r}`" if isinstance(value, str) else
                 f"\t`--{name}` was set to a value of `{value}`" for name, value in resolved.defaulted]
        logger.warning("The following values were not passed to `accelerate launch` and had defaults used instead:\n"
                       + "\n".join(lines) + "\nTo avoid this warning pass in values for each of the problematic "
                       "parameters or run `accelerate config`.")
    defaults = config_object(resolved.file) if resolved.path is not None else None
    return args, defaults, resolved.precision_from_file


def _resolved(args: argparse.Namespace) -> ResolvedLaunch:
    """What `_validate_launch_command` resolved for `args` (a namespace that skipped it is validated now)."""
    if getattr(args, _RESOLVED, None) is None:
        _validate_launch_command(args)
    return getattr(args, _RESOLVED)


def _start(args: argparse.Namespace, through_torchrun: bool = False) -> None:
    """Start the resolved launch as Accelerate's launchers do: a child process at least, the switch on, errors raised.

    Stopped by Ctrl-C or a signal, it exits 128 + the signal (130 for Ctrl-C) once every process has ended.
    """
    from ..launch.run import execute_outcome

    resolved = _resolved(args)
    quiet = bool(getattr(args, "quiet", False))
    tail = ""
    if deepspeed_runs_itself(resolved.config):
        code, command = run_deepspeed_itself(args, resolved, switch=True), ["deepspeed"]
    else:
        # As Accelerate's: a missing script fails in the child, whose stderr then goes with the error
        plan = build_plan(args, resolved, in_this_process=False, extra_env=switch_env(),
                          through_torchrun=through_torchrun, check_script=False)
        if not quiet:
            print_notes(resolved, "accelerate launch")
        if getattr(args, "dry_run", False):
            print(plan.describe())
            return
        try:
            outcome = execute_outcome(plan)
        except KeyboardInterrupt:  # the agent let Ctrl-C through after stopping its workers
            sys.exit(130)
        if outcome.signum is not None:
            sys.exit(128 + outcome.signum)
        code, command, tail = outcome.code, plan.command(), outcome.stderr_tail
    if code != 0:
        if quiet:
            sys.exit(1)
        error = subprocess.CalledProcessError(returncode=code, cmd=command, stderr=tail or None)
        raise error from (RuntimeError(tail) if tail else None)


def simple_launcher(args: argparse.Namespace) -> None:
    """Accelerate's simple launcher: the run's processes (one as a child; several through torchrun; mpirun's)."""
    _start(args)


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Accelerate's torchrun launcher (several GPUs, FSDP): the run's processes through torchrun, even just one."""
    _start(args, through_torchrun=True)


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """DeepSpeed's run: torchrun on one machine (or with the standard launcher), else DeepSpeed's own launcher."""
    from importlib.util import find_spec

    if find_spec("deepspeed") is None:
        raise ImportError("DeepSpeed is not installed; pip install deepspeed (or build it from source).")
    _start(args, through_torchrun=True)


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
    """Run a parsed `accelerate launch`: validate it, then start it through Accelerate's launcher of that name.

    Example:
        >>> launch_command(launch_command_parser().parse_args(["--tpu", "train.py"]))  # doctest: +SKIP
        Traceback (most recent call last):
        ...
        NotImplementedError: --tpu: hasten has no TPU (torch_xla) support; run on GPUs or CPUs instead.
    """
    args, defaults, _ = _validate_launch_command(args)
    config = _resolved(args).config
    if args.tpu:
        tpu_pod_launcher(args) if args.tpu_use_cluster else tpu_launcher(args)
    elif isinstance(defaults, SageMakerConfig):
        sagemaker_launcher(defaults, args)
    elif config.use_deepspeed:
        deepspeed_launcher(args)
    elif config.use_fsdp or config.num_processes > 1 or config.num_machines > 1:
        multi_gpu_launcher(args)
    else:
        simple_launcher(args)


def main() -> None:
    """`accelerate-launch ARGS`: parse the command line and launch.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    launch_command(launch_command_parser().parse_args())
