"""From resolved launch settings to the `LaunchPlan`: the refusals, the launch spec, the plan (nothing starts).

`launch_settings.resolve_config` settles what the launch is; `build_plan`
refuses what cannot work in one sentence each — a flag for what hasten has
not (TPU, SageMaker, Megatron-LM), an engine's option without its engine,
sizes that cannot cover the processes, torchrun's options on an mpirun run
— builds the `LaunchSpec` each process receives (`spec_for`) and the
`LaunchPlan` that `launch.run` carries out.

Example:
    >>> spec_for(LaunchConfig(mixed_precision="bf16", use_cpu=True)).mixed_precision
    'bf16'
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Mapping

from ..launch.config import (ConfigError, DeepSpeedConfig, FSDPConfig, LaunchConfig, config_fields, default_of,
                             section_values)
from ..process.aliasing import SITE_DIRECTORY
from ..process.launch_spec import AS_ACCELERATE_ENV
from .launch_settings import ResolvedLaunch

__all__ = ["REFUSED", "build_plan", "spec_for", "refuse_what_hasten_lacks", "launch_env", "deepspeed_runs_itself",
           "unused_settings", "print_notes", "switch_env"]

_DEEPSPEED = {f.name for f in dataclasses.fields(DeepSpeedConfig)} - {"gradient_accumulation_steps"}
_FSDP = {f.name for f in dataclasses.fields(FSDPConfig)}
# Accelerate's flags for what hasten has not, each with the sentence that refuses it
_NO_TPU = "{flag}: hasten has no TPU (torch_xla) support; run on GPUs or CPUs instead, and drop {flag}."
_NO_MEGATRON = ("{flag}: hasten has no Megatron-LM engine; use FSDP (--use_fsdp, with --parallelism_config_* for "
                "tensor parallel) or DeepSpeed (--use_deepspeed) instead.")
_NO_SAGEMAKER = "{flag}: hasten launches no Amazon SageMaker job; run `hasten launch` on the machines themselves."
REFUSED = {**{name: _NO_TPU for name in ("tpu", "tpu_use_cluster", "tpu_use_sudo", "vm", "env", "downcast_bf16",
                                           "main_training_function")},
           "use_megatron_lm": _NO_MEGATRON,
           **{name: _NO_SAGEMAKER for name in ("aws_access_key_id", "aws_secret_access_key")}}


def refuse_what_hasten_lacks(given: Mapping[str, Any], sagemaker: bool = False) -> None:
    """Refuse, in one sentence, a flag for what hasten has not: TPU, SageMaker, Megatron-LM.

    Example:
        >>> refuse_what_hasten_lacks({"tpu": True})
        Traceback (most recent call last):
        ...
        hasten.core.errors.ConfigError: --tpu: hasten has no TPU (torch_xla) support; run on GPUs or CPUs instead, and drop --tpu.
    """
    for name, value in given.items():
        if name.startswith("megatron_lm_"):
            raise ConfigError(_NO_MEGATRON.format(flag=f"--{name}"))
        if name in REFUSED and value not in (None, False) or (name == "tpu_use_cluster" and value is False):
            flag = {"tpu_use_cluster": "--tpu_cluster" if value else "--no_tpu_cluster"}.get(name, f"--{name}")
            raise ConfigError(REFUSED[name].format(flag=flag))
    if sagemaker:
        raise ConfigError(_NO_SAGEMAKER.format(flag="compute_environment: AMAZON_SAGEMAKER (the config file)"))


def spec_for(config: LaunchConfig, gradient_accumulation_steps: int | None = None,
             deepspeed_config_fields: str | None = None) -> Any:
    """The `LaunchSpec` every process receives for `config`: the engine sections hold what was given, no defaults.

    Example:
        >>> spec_for(LaunchConfig(use_fsdp=True, fsdp_config={"fsdp_offload_params": "false"})).fsdp
        {'fsdp_offload_params': False}
    """
    from ..process.launch_spec import LaunchSpec, dynamo_settings, fp8_settings, parallelism_settings

    deepspeed = fsdp = None
    if config.use_deepspeed:
        deepspeed = _section(DeepSpeedConfig, config.deepspeed_config, "deepspeed_config")
        if gradient_accumulation_steps is not None:
            deepspeed["gradient_accumulation_steps"] = gradient_accumulation_steps
    if config.use_fsdp:
        fsdp = _section(FSDPConfig, config.fsdp_config, "fsdp_config")
    try:
        fp8 = fp8_settings(config.fp8_config) if config.fp8_config and config.mixed_precision == "fp8" else None
        parallelism = parallelism_settings(config.parallelism_config) if config.parallelism_config else None
        dynamo = dynamo_settings(config.dynamo_config)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return LaunchSpec(mixed_precision=config.mixed_precision, cpu=config.use_cpu, debug=config.debug,
                      gradient_accumulation_steps=gradient_accumulation_steps, deepspeed=deepspeed, fsdp=fsdp,
                      dynamo=dynamo, parallelism=parallelism, fp8=fp8, cpu_affinity=config.enable_cpu_affinity,
                      deepspeed_config_fields=deepspeed_config_fields if config.use_deepspeed else None)


def _section(schema: type, data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The keys a section gave, each as its schema's type (``"false"`` -> False); unset ones left out."""
    return {key: value for key, value in section_values(schema, data, name).items() if value is not None}


_TORCHRUN_ONLY = {"tee": "0", "log_dir": None, "role": "default", "rdzv_conf": ""}


def _engine_options_need_their_engine(given: Mapping[str, Any], config: LaunchConfig) -> None:
    for name in given:
        if name in _DEEPSPEED and not config.use_deepspeed:
            raise ConfigError(f"--{name} is a DeepSpeed option; add --use_deepspeed.")
        if name in _FSDP and not config.use_fsdp:
            raise ConfigError(f"--{name} is an FSDP option; add --use_fsdp.")




def _check_precision(config: LaunchConfig) -> None:
    """Refuse a precision the chosen devices cannot do, before starting anything."""
    if config.mixed_precision != "bf16" or config.use_cpu:
        return
    from ..launch.gpus import gpu_compute_capabilities

    old = [index for index, capability in enumerate(gpu_compute_capabilities()) if capability < (8, 0)]
    if old:
        raise ConfigError(f"--mixed_precision bf16 needs GPUs of compute capability 8.0 or newer, but GPU(s) {old} "
                          "are older; use --mixed_precision fp16.")


def _check_parallelism(spec: Any, num_processes: int) -> None:
    """Sizes that cannot cover the processes, refused before anything starts (Accelerate finds out in every process)."""
    if not spec.parallelism:
        return
    try:
        sizes = {key: int(spec.parallelism.get(key, "1")) for key in ("dp_replicate_size", "dp_shard_size", "tp_size",
                                                                      "cp_size", "sp_size")}
    except ValueError as error:
        raise ConfigError(f"parallelism_config sizes must be whole numbers ({error}).") from None
    total = sizes["dp_replicate_size"] * sizes["dp_shard_size"] * sizes["tp_size"] * sizes["cp_size"]
    if sizes["sp_size"] > 1:  # DeepSpeed's Ulysses makes its own sequence x data groups over every process
        if num_processes % sizes["sp_size"]:
            raise ConfigError(f"parallelism_config_sp_size {sizes['sp_size']} does not divide --num_processes "
                              f"{num_processes}; pick an sp size that does.")
    elif total != 1 and total != num_processes:
        raise ConfigError(f"the parallelism_config sizes multiply to {total} but --num_processes is {num_processes}; "
                          "make dp_replicate x dp_shard x tp x cp equal the number of processes.")


def _checked_spec(resolved: ResolvedLaunch, steps: int | None) -> Any:
    config = resolved.config
    if config.fp8_config and config.mixed_precision != "fp8":
        raise ConfigError(f"fp8 settings were given but mixed_precision is {config.mixed_precision!r}; add "
                          "--mixed_precision fp8, or drop the fp8 settings.")
    dynamo = str((config.dynamo_config or {}).get("dynamo_backend") or "no").upper()
    from ..options.enums import DynamoBackend

    if dynamo not in {b.value for b in DynamoBackend}:
        raise ConfigError(f"dynamo_backend {dynamo.lower()!r} is not a torch.compile backend Accelerate names; use "
                          f"one of {', '.join(b.value.lower() for b in DynamoBackend)}.")
    fields = list(resolved.file.get("deepspeed_config") or {}) + ["mixed_precision"] * resolved.precision_from_file
    spec = spec_for(config, steps, ",".join(fields))
    _check_parallelism(spec, config.num_processes)
    return spec


def _port(config: LaunchConfig) -> int | None:
    """0 (Accelerate's "a free one") and unset are the plan's choice: a free port on one machine, else 29500."""
    return config.main_process_port or None


def _rdzv_conf(text: str) -> dict[str, str]:
    pairs = [part for part in (text or "").split(",") if part.strip()]
    if any("=" not in part for part in pairs):
        raise ConfigError(f"--rdzv_conf {text!r} must be key=value pairs separated by commas, e.g. join_timeout=900.")
    return dict(part.strip().split("=", 1) for part in pairs)


def launch_env(args: argparse.Namespace, config: LaunchConfig) -> dict[str, str]:
    """What every process gets besides the spec: the thread count asked for, DeepSpeed's path.

    (Not Accelerate's simple launcher's Intel OpenMP pinning, KMP_AFFINITY
    compact: with several processes on a machine it would pin them all to
    the same cores.)

    Example:
        >>> launch_env(argparse.Namespace(num_cpu_threads_per_process=4), LaunchConfig(use_cpu=True))
        {'OMP_NUM_THREADS': '4'}
    """
    env = {}
    threads = getattr(args, "num_cpu_threads_per_process", None)
    if threads is not None:  # else the environment's, else cores / processes (`LaunchPlan.worker_env`)
        if threads < 1:
            raise ConfigError(f"--num_cpu_threads_per_process must be at least 1, got {threads}.")
        env["OMP_NUM_THREADS"] = str(threads)
    if config.use_deepspeed:  # Accelerate's DeepSpeed launcher puts the working directory on the path
        paths = [part for part in os.environ.get("PYTHONPATH", "").split(":") if part]
        env["PYTHONPATH"] = ":".join([*paths, os.path.abspath(".")])
    return env


def build_plan(args: argparse.Namespace, resolved: ResolvedLaunch, in_this_process: bool = True,
               extra_env: Mapping[str, str] | None = None, through_torchrun: bool = False,
               check_script: bool = True) -> Any:
    """The `LaunchPlan` of a resolved launch, refused in one sentence where it cannot work; nothing starts.

    `in_this_process`: a one-process run in this process (`hasten launch`)
    or as a child (`accelerate launch`); `extra_env` reaches every process;
    `through_torchrun`: torch's elastic agent even for one process (Accelerate's multi-GPU launcher);
    `check_script=False`: a missing script fails where it runs, not here (`accelerate launch`).
    """
    from ..launch.plan import LaunchPlan

    given, config = resolved.given, resolved.config
    appended = {name: getattr(args, name, None) for name in ("vm", "env")}  # append options are not recorded as given
    refuse_what_hasten_lacks({**given, **{name: value for name, value in appended.items() if value}}, resolved.sagemaker)
    _engine_options_need_their_engine(given, config)
    steps = getattr(args, "gradient_accumulation_steps", None)
    if steps is not None and steps < 1:
        raise ConfigError(f"--gradient_accumulation_steps must be at least 1, got {steps}.")
    _check_precision(config)
    spec = _checked_spec(resolved, steps)
    torchrun_only = [f"--{name}" for name, default in _TORCHRUN_ONLY.items() if getattr(args, name, default) != default]
    if config.mpirun and torchrun_only:
        raise ConfigError(f"{', '.join(torchrun_only)}: torchrun's options, but mpirun starts this run; drop them "
                          "or drop --mpirun.")
    no_python = bool(getattr(args, "no_python", False))
    if no_python and getattr(args, "module", False):
        raise ConfigError("--module and --no_python cannot be used together; keep one of them.")
    return LaunchPlan(
        target=args.training_script, target_args=tuple(args.training_script_args or ()),
        module=bool(getattr(args, "module", False)),
        num_processes=config.num_processes, num_machines=config.num_machines, min_machines=config.min_machines,
        machine_rank=config.machine_rank,
        main_process_ip=config.main_process_ip, main_process_port=_port(config), rdzv_backend=config.rdzv_backend,
        max_restarts=config.max_restarts, monitor_interval=config.monitor_interval,
        liveness_timeout=config.liveness_timeout, mpirun=config.mpirun, mpirun_hostfile=config.mpirun_hostfile,
        gpu_ids=config.gpu_ids, network_interface=config.network_interface, quiet=bool(getattr(args, "quiet", False)),
        spec=spec, extra_env={**launch_env(args, config), **(extra_env or {})},
        in_this_process=in_this_process and not no_python, through_torchrun=through_torchrun,
        rdzv_conf=_rdzv_conf(getattr(args, "rdzv_conf", "")) or None,
        tee=str(getattr(args, "tee", "0")), log_dir=getattr(args, "log_dir", None),
        role=getattr(args, "role", "default"), no_python=no_python,
        live=getattr(args, "elastic_recovery", "restart") == "live",
    ).validate(check_script=check_script)


def deepspeed_runs_itself(config: LaunchConfig) -> bool:
    """DeepSpeed's own launcher starts this run: several machines, and a DeepSpeed launcher other than `standard`.

    An elastic run (`--num_machines MIN:MAX`) is torch's elastic agent's on every machine, whatever the engine:
    DeepSpeed's launchers start a fixed group.

    Example:
        >>> deepspeed_runs_itself(LaunchConfig(use_deepspeed=True, num_machines=2, num_processes=2, main_process_ip="h"))
        True
        >>> deepspeed_runs_itself(LaunchConfig(use_deepspeed=True, num_machines=2, min_machines=1, num_processes=2,
        ...                                    main_process_ip="h"))
        False
    """
    launcher = (config.deepspeed_config or {}).get("deepspeed_multinode_launcher") or "pdsh"
    return config.use_deepspeed and config.num_machines > 1 and launcher != "standard" and config.min_machines is None


def unused_settings(config: LaunchConfig) -> list[tuple[str, str]]:
    """Compatibility keys of the config file that hold a value hasten does not use: (name, what it is for).

    Example:
        >>> from hasten.launch.config import from_dict
        >>> unused_settings(from_dict({"tpu_name": "pod-1"}, source="example"))
        [('tpu_name', 'TPU only')]
    """
    return [(f.name, f.metadata["help"]) for f in config_fields(LaunchConfig, include_ignored=True)
            if f.metadata["ignored"] and getattr(config, f.name) != default_of(f)]


def print_notes(resolved: ResolvedLaunch, prog: str) -> None:
    """One line per config-file key that holds a value hasten does not use (none with --quiet)."""
    for name, help_text in unused_settings(resolved.config):
        sys.stderr.write(f"{prog}: note: the config file's {name} ({help_text}) is not used by hasten; remove it "
                         "from the file to silence this note.\n")


def switch_env() -> dict[str, str]:
    """The accelerate switch in every process: scripts written for Accelerate import `accelerate` and get hasten.

    Example:
        >>> switch_env()[AS_ACCELERATE_ENV]
        '1'
    """
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIRECTORY]
    return {AS_ACCELERATE_ENV: "1", "PYTHONPATH": os.pathsep.join([SITE_DIRECTORY, *paths])}
