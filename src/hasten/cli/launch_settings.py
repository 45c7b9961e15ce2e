"""The launch command's one resolution: the flags given + the config file + defaults -> LaunchConfig -> LaunchPlan.

Both fronts of the command use it: `hasten launch` (`cli/launch.py`) and
Accelerate's `accelerate launch` (`cli/launchers.py`). A flag wins when it
was given on the command line (the parser records those in `nondefault`),
else the config file's key of the same name, else the default; a flag given
for what hasten lacks (TPU, SageMaker, Megatron-LM), or that cannot work
with the rest, is refused in one sentence before anything starts.

`cli/launch_build.py` then turns the settings into the `LaunchPlan`.

Where a new launch setting goes: its flag in `cli/launch_flags.py`, its
config-file key (with type, default and help) in `launch/config.py`'s
`LaunchConfig`; a flag whose name is the key needs nothing here. What the
plan takes from it is passed in `launch_build.build_plan`.

Example:
    >>> import argparse
    >>> from hasten.cli.launch_flags import add_launch_arguments
    >>> from hasten.cli.recording_parser import CustomArgumentParser
    >>> parser = CustomArgumentParser(prog="launch", add_help=False)
    >>> add_launch_arguments(parser)
    >>> args = parser.parse_args(["--config_file", "/dev/null", "--cpu", "--num_processes", "2", "train.py"])
    >>> config = resolve_config(args).config
    >>> config.num_processes, config.use_cpu, config.distributed_type
    (2, True, 'MULTI_CPU')
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..launch.config import (ConfigError, DeepSpeedConfig, FSDPConfig, LaunchConfig, config_fields,
                             config_file_to_read, from_dict, read_raw)
from ..launch.config_migration import migrate

__all__ = ["ResolvedLaunch", "resolve_config", "settings_of_namespace", "merge_options", "given_options", "gpu_count",
           "namespace_view", "threads_per_process"]

_KEYS = {f.name for f in config_fields(LaunchConfig)}
_DEEPSPEED = {f.name for f in dataclasses.fields(DeepSpeedConfig)} - {"gradient_accumulation_steps"}
_FSDP = {f.name for f in dataclasses.fields(FSDPConfig)}
_SECTIONS = {"deepspeed_config", "fsdp_config", "dynamo_config", "fp8_config", "parallelism_config"}
_ENGINES = ("multi_gpu", "multi_cpu", "use_deepspeed", "use_fsdp")
# the base sizes `--use_parallelism_config` alone turns on (Accelerate's flag defaults)
_PARALLELISM_BASE = {f"parallelism_config_{key}": 1 for key in ("dp_replicate_size", "dp_shard_size", "tp_size",
                                                                 "cp_size")}


@dataclass
class ResolvedLaunch:
    """What a launch settled on: the config, where it came from, and what defaulted.

    Example:
        >>> ResolvedLaunch(LaunchConfig()).config.num_processes
        1
    """

    config: LaunchConfig
    path: Path | None = None  # the config file read (None: there was none)
    file: dict[str, Any] = field(default_factory=dict)  # its keys, brought to the current layout
    given: dict[str, Any] = field(default_factory=dict)  # the options given on the command line, by destination
    defaulted: list[tuple[str, Any]] = field(default_factory=list)  # what neither gave: (setting, value used)
    sagemaker: bool = False  # the file is Accelerate's SageMaker config (refused at launch)

    @property
    def precision_from_file(self) -> bool:
        """The mixed precision is the config file's (Accelerate tells DeepSpeed so)."""
        return "mixed_precision" not in self.given and self.file.get("mixed_precision") is not None


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options the command line gave (recorded by the parser in ``nondefault``), by destination.

    Example:
        >>> given_options(argparse.Namespace(num_processes=2, cpu=False, nondefault={"num_processes"}))
        {'num_processes': 2}
    """
    return {name: getattr(args, name) for name in sorted(getattr(args, "nondefault", ()))
            if name not in ("training_script", "training_script_args")}


def gpu_count(use_cpu: bool = False, env: Mapping[str, str] | None = None) -> int:
    """The GPUs a launch on this machine sees (CUDA_VISIBLE_DEVICES counts), without initialising CUDA.

    Example:
        >>> gpu_count(use_cpu=True)
        0
    """
    env = os.environ if env is None else env
    if use_cpu or shutil.which("nvidia-smi") is None:
        return 0
    from ..launch.gpus import gpu_compute_capabilities

    found = len(gpu_compute_capabilities())
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return found if visible is None else min(found, len([part for part in visible.split(",") if part.strip()]))


def merge_options(data: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """A config file's keys (`data`) with launch options over them, by the file's key names.

    An engine flag (--multi_gpu, --multi_cpu, --use_deepspeed, --use_fsdp)
    replaces the file's engine, as in `accelerate launch`; options that are
    not config-file settings (the script, --tee, ...) are left out.

    Example:
        >>> merge_options({"use_fsdp": True, "fsdp_config": {"fsdp_version": 2}}, {"multi_gpu": True, "zero_stage": 3})
        {'use_fsdp': False, 'fsdp_config': {'fsdp_version': 2}, 'deepspeed_config': {'zero_stage': 3}, 'use_deepspeed': False, 'distributed_type': 'MULTI_GPU'}
    """
    out = dict(data)
    sections: dict[str, dict[str, Any]] = {}
    for name, value in options.items():
        key = "use_cpu" if name == "cpu" else name
        if value is None or name in _ENGINES or name == "use_parallelism_config":
            continue
        section = ("deepspeed_config" if key in _DEEPSPEED else "fsdp_config" if key in _FSDP
                   else "dynamo_config" if key.startswith("dynamo_") else "fp8_config" if key.startswith("fp8_")
                   else "parallelism_config" if key.startswith("parallelism_config_") else None)
        if section is not None:
            sections.setdefault(section, dict(out.get(section) or {}))[key] = value
        elif key in _KEYS and key not in _SECTIONS:
            out[key] = value
            if key == "mpirun_hostfile" and options.get("mpirun") is not False:
                out["mpirun"] = True  # Accelerate's meaning: a hostfile starts the processes with mpirun
    if options.get("use_parallelism_config") and not sections.get("parallelism_config", out.get("parallelism_config")):
        sections["parallelism_config"] = dict(_PARALLELISM_BASE)
    out.update(sections)
    engines = {name: bool(options.get(name)) for name in _ENGINES}
    if any(engines.values()):
        out["use_deepspeed"], out["use_fsdp"] = engines["use_deepspeed"], engines["use_fsdp"]
        out["distributed_type"] = ("DEEPSPEED" if engines["use_deepspeed"] else "FSDP" if engines["use_fsdp"]
                                   else "MULTI_CPU" if engines["multi_cpu"] else "MULTI_GPU")
        if engines["multi_cpu"]:
            out["use_cpu"] = True
    else:
        for name in ("use_deepspeed", "use_fsdp"):  # --no-use_fsdp and the like
            if options.get(name) is False:
                out[name] = False
    return out


def _checked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as settings: the per-machine count made the total, contradictions refused."""
    out = dict(options)
    if out.get("multi_cpu") and out.get("multi_gpu"):
        raise ConfigError("--multi_cpu and --multi_gpu exclude each other; pick one.")
    if out.get("cpu") and out.get("multi_gpu"):
        raise ConfigError("--cpu and --multi_gpu exclude each other: keep one of them.")
    if out.get("multi_gpu") and out.get("num_processes") is not None and out["num_processes"] < 2:
        raise ConfigError("--multi_gpu needs at least 2 processes; raise --num_processes or drop --multi_gpu.")
    return out


def _per_machine(data: dict[str, Any], options: Mapping[str, Any]) -> None:
    per_machine = options.get("num_processes_per_machine")
    if per_machine is None:
        return
    if per_machine < 1:
        raise ConfigError(f"--num_processes_per_machine must be at least 1, got {per_machine}.")
    total = per_machine * int(str(data.get("num_machines") or 1).rpartition(":")[2])  # (MIN:MAX: at MAX)
    given = options.get("num_processes")
    if given is not None and given != total:
        raise ConfigError(f"--num_processes {given} (total) disagrees with --num_processes_per_machine {per_machine} "
                          f"on {data.get('num_machines') or 1} machine(s) = {total}; give only one of them.")
    data["num_processes"] = total


def _check_gpus(config: LaunchConfig) -> None:
    """Accelerate's check: a multi-GPU run on one machine needs two GPUs or more."""
    ids = [part for part in config.gpu_ids.split(",") if part.strip()]
    if config.distributed_type == "MULTI_GPU" and config.gpu_ids != "all" and len(ids) < 2 and config.num_machines <= 1:
        raise ConfigError(f"gpu_ids {config.gpu_ids!r} names fewer than two GPUs for a run on multiple GPUs; give at "
                          "least two in --gpu_ids, or --gpu_ids all.")


def _read_file(args: argparse.Namespace) -> tuple[Path | None, dict[str, Any], bool]:
    """(path, its data brought to the current layout, whether it is a SageMaker config), the file checked alone."""
    path = config_file_to_read(getattr(args, "config_file", None))
    if path is None:
        return None, {}, False
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist; create it with `hasten config`.")
    raw = read_raw(path)
    if isinstance(raw, Mapping) and str(raw.get("compute_environment", "")).upper() == "AMAZON_SAGEMAKER":
        return path, dict(raw), True
    source = f"config file {str(path)!r}"
    try:
        from_dict(raw, source=source)  # its own mistakes name the file
    except ConfigError as error:
        raise (error if source in str(error) else ConfigError(f"{source}: {error}")) from None
    return path, migrate(raw), False


def resolve_config(args: argparse.Namespace) -> ResolvedLaunch:
    """The launch's settings: the options given over the config file over the defaults, validated.

    Without a config file, the number of processes is one per visible GPU
    (at least one), as `accelerate launch` chooses it.
    """
    options = _checked_options(given_options(args))
    path, file, sagemaker = _read_file(args)
    data = merge_options({} if sagemaker else file, options)
    _per_machine(data, options)
    defaulted: list[tuple[str, Any]] = []
    if path is None:
        if "num_processes" not in data:
            data["num_processes"] = max(1, gpu_count(bool(data.get("use_cpu"))))
            defaulted.append(("num_processes", data["num_processes"]))
        if int(data["num_processes"]) > 1 and not any(options.get(name) for name in _ENGINES) \
                and gpu_count(bool(data.get("use_cpu"))) > 1:
            data["distributed_type"] = "MULTI_GPU"  # Accelerate: "More than one GPU was found"
        defaulted += [(name, value) for name, value in (("num_machines", 1), ("mixed_precision", "no"),
                                                        ("dynamo_backend", "no")) if name not in options]
    if data.get("use_cpu") and int(data.get("num_processes") or 1) > 1 and data.get("distributed_type", "NO") == "NO":
        data["distributed_type"] = "MULTI_CPU"
    config = from_dict(data, source="the command line and config file")
    _check_gpus(config)
    return ResolvedLaunch(config, path, file, dict(options), defaulted, sagemaker)


def settings_of_namespace(args: argparse.Namespace) -> LaunchConfig:
    """The settings a complete namespace holds (every value in it counts as given; no file is read).

    This is how Accelerate's `prepare_*` helpers, which take a filled
    namespace, reach the same `LaunchConfig` as a launch.

    Example:
        >>> settings_of_namespace(argparse.Namespace(num_processes=2, cpu=True, mixed_precision="bf16")).mixed_precision
        'bf16'
    """
    options = {name: value for name, value in vars(args).items() if value is not None}
    if not options.get("use_parallelism_config"):  # the parser's default sizes mean nothing then
        options = {name: value for name, value in options.items() if not name.startswith("parallelism_config_")}
    if getattr(args, "use_cpu", None) is not None:
        options["cpu"] = bool(args.use_cpu or getattr(args, "cpu", False))
    engines = {name: options.pop(name, None) for name in _ENGINES}
    data = merge_options({}, options)
    if engines.get("use_deepspeed") or engines.get("use_fsdp"):
        data.update(use_deepspeed=bool(engines.get("use_deepspeed")), use_fsdp=bool(engines.get("use_fsdp")))
    return from_dict(data, source="the launch arguments")


def threads_per_process(args: argparse.Namespace, config: LaunchConfig) -> int:
    """OMP_NUM_THREADS of each process: the flag's, else the environment's, else this machine's cores / its processes.

    Example:
        >>> threads_per_process(argparse.Namespace(num_cpu_threads_per_process=3), LaunchConfig())
        3
    """
    from ..launch.plan import available_cpus

    given = getattr(args, "num_cpu_threads_per_process", None)
    if given is not None:
        return int(given)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, available_cpus() // max(1, config.processes_per_machine))


_PREFIXES = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_", "deepspeed_config": "",
             "parallelism_config": "parallelism_config_"}


def namespace_view(resolved: ResolvedLaunch, args: argparse.Namespace) -> argparse.Namespace:
    """Write the resolved settings onto `args` under the flags' names (what Accelerate's validation leaves there).

    Example:
        >>> args = namespace_view(ResolvedLaunch(LaunchConfig(num_processes=2, use_cpu=True)), argparse.Namespace())
        >>> args.num_processes, args.use_cpu, args.multi_gpu, args.dynamo_backend
        (2, True, False, 'no')
    """
    config = resolved.config
    for name in ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
                 "rdzv_backend", "same_network", "network_interface", "gpu_ids", "mixed_precision", "debug",
                 "max_restarts", "monitor_interval", "liveness_timeout", "mpirun", "mpirun_hostfile", "use_cpu",
                 "use_deepspeed", "use_fsdp", "enable_cpu_affinity"):
        setattr(args, name, getattr(config, name))
    args.multi_gpu = config.distributed_type == "MULTI_GPU"
    args.use_parallelism_config = bool(config.parallelism_config)
    for section, prefix in _PREFIXES.items():
        for key, value in (getattr(config, section) or {}).items():
            setattr(args, key if key.startswith(prefix) else prefix + key, value)
    args.dynamo_backend = (config.dynamo_config or {}).get("dynamo_backend") or "no"
    args.num_cpu_threads_per_process = threads_per_process(args, config)
    return args
