"""`hasten launch`: start a training script as configured (flags override the config file)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from ..process.launch_spec import AS_ACCELERATE_ENV, dynamo_settings, fp8_settings, parallelism_settings
from ..launch.config import (
    ConfigError,
    DeepSpeedConfig,
    FSDPConfig,
    LaunchConfig,
    config_fields,
    default_config_path,
    default_of,
    field_type,
    from_dict,
    load_config,
    to_dict,
)

DESCRIPTION = """\
Start SCRIPT (or -m MODULE) as configured by `hasten config`, on this machine.

Precedence: command-line flags > the config file > defaults. Process start
and rendezvous are torch.distributed.run's (or Open MPI's mpirun with
--mpirun); the settings reach every process as one launch spec, which
Accelerator() reads.

--num_processes is the TOTAL number of processes across all machines;
use --num_processes_per_machine to give the per-machine count instead.
"""

# Flags whose names differ from the schema's field names (kept for users of the peer tool).
_ALIASES = {"use_cpu": ("--cpu",)}
_GROUPS = {
    "hardware": ("num_processes", "gpu_ids", "use_cpu", "mixed_precision", "debug"),
    "several machines": ("num_machines", "machine_rank", "main_process_ip", "main_process_port", "rdzv_backend",
                         "same_network", "network_interface"),
    "elastic": ("max_restarts", "monitor_interval", "liveness_timeout"),
    "MPI (multi-CPU)": ("mpirun", "mpirun_hostfile"),
    "DeepSpeed / FSDP": ("use_deepspeed", "use_fsdp"),
}


def _add_field_flag(group: Any, f: dataclasses.Field, dest: str) -> None:
    names = [f"--{f.name}"]
    if "_" in f.name:
        names.append(f"--{f.name.replace('_', '-')}")
    names += list(_ALIASES.get(f.name, ()))
    kind = field_type(f)
    help_text = f.metadata["help"]
    kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": help_text}
    if kind is bool:  # --flag / --no-flag; absent = take the config file's value
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = kind
        choices = f.metadata.get("choices")
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["metavar"] = f.name.split("_")[-1].upper()
    group.add_argument(*names, **kwargs)


def _add_dynamo_flags(group: Any) -> None:
    """Accelerate's compile flags; they fill the config file's `dynamo_config` (dest ``dynamo:<key>``)."""
    from ..options.enums import DynamoBackend

    group.add_argument("--dynamo_backend", "--dynamo-backend", dest="dynamo:dynamo_backend", default=None,
                       type=str.lower, choices=[b.value.lower() for b in DynamoBackend],
                       help="compile every prepared model with this torch.compile backend ('no': do not compile)")
    group.add_argument("--dynamo_mode", "--dynamo-mode", dest="dynamo:dynamo_mode", default=None,
                       choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                       help="torch.compile mode")
    for name, text in (("use_fullgraph", "one graph for the whole model (fullgraph=True)"),
                       ("use_dynamic", "dynamic shapes (dynamic=True)"),
                       ("use_regional_compilation", "compile each repeated block instead of the whole model")):
        group.add_argument(f"--dynamo_{name}", f"--dynamo-{name.replace('_', '-')}", dest=f"dynamo:dynamo_{name}",
                           default=None, action=argparse.BooleanOptionalAction, help=text)


# Accelerate's --parallelism_config_* flags: (key in the config file's parallelism_config, type, choices)
_PARALLELISM_FLAGS = (("dp_replicate_size", int, None), ("dp_shard_size", int, None), ("tp_size", int, None),
                      ("cp_size", int, None), ("cp_backend", str, ["torch"]),
                      ("cp_comm_strategy", str, ["allgather", "alltoall"]), ("sp_size", int, None),
                      ("sp_backend", str, ["deepspeed"]), ("sp_seq_length", str, None),
                      ("sp_seq_length_is_variable", str, ["true", "false", "True", "False"]),
                      ("sp_attn_implementation", str, None))


def _add_fp8_flags(group: Any) -> None:
    """Accelerate's --fp8_* flags; they fill the config file's `fp8_config` (dest ``fp8:fp8_<key>``)."""
    for key, kind, choices in (("backend", str.lower, ["ao", "te", "msamp"]), ("pad_inner_dim", str, ["true", "false"]),
                               ("enable_fsdp_float8_all_gather", str, ["true", "false"]),
                               ("format", str, ["HYBRID", "E4M3", "E5M2"]), ("margin", int, None), ("interval", int, None),
                               ("amax_history_len", int, None), ("amax_compute_algo", str, ["max", "most_recent"]),
                               ("override_linear_precision", str, None), ("opt_level", str, ["O1", "O2"])):
        group.add_argument(f"--fp8_{key}", f"--fp8-{key.replace('_', '-')}", dest=f"fp8:fp8_{key}", default=None,
                           type=kind, choices=choices, metavar=None if choices else key.split("_")[-1].upper(),
                           help=f"fp8 recipe's {key} (read by Accelerator() through ACCELERATE_FP8_*)")
    group.add_argument("--fp8_use_autocast_during_eval", dest="fp8:fp8_use_autocast_during_eval", default=None,
                       action="store_true", help="Transformer Engine: fp8 autocast in evaluation too")


def _add_parallelism_flags(group: Any) -> None:
    """Accelerate's N-D flags; they fill the config file's `parallelism_config` (dest ``pc:parallelism_config_<key>``)."""
    group.add_argument("--use_parallelism_config", "--use-parallelism-config", dest="pc:use", default=None,
                       action="store_true", help="build ParallelismConfig() in Accelerator() from the sizes below")
    for key, kind, choices in _PARALLELISM_FLAGS:
        name = f"parallelism_config_{key}"
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=f"pc:{name}", default=None, type=kind,
                           choices=choices, metavar=None if choices else key.split("_")[-1].upper(),
                           help=f"ParallelismConfig's {key} (default: Accelerate's)")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "launch",
        help="start a training script on 1 or N processes, on 1 or N machines",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `script.py --start 1`: the script's own flags are never prefixes of launcher options
    )
    parser.add_argument("--config_file", "--config-file", default=None, metavar="PATH",
                        help=f"config file to read (default: {default_config_path()} if it exists)")
    fields_by_name = {f.name: f for f in config_fields(LaunchConfig)}
    for title, names in _GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            _add_field_flag(group, fields_by_name[name], name)
        if title == "hardware":
            group.add_argument("--num_processes_per_machine", "--num-processes-per-machine", type=int, default=None,
                               metavar="N", help="processes on each machine (instead of the total --num_processes)")
            group.add_argument("--multi_cpu", "--multi-cpu", action="store_true", help="several processes on CPUs")
            group.add_argument("--multi_gpu", "--multi-gpu", action="store_true", help="several processes on GPUs")
            group.add_argument("--gradient_accumulation_steps", "--gradient-accumulation-steps", type=int,
                               default=None, metavar="K", help="default gradient accumulation steps for Accelerator()")
    for title, schema, prefix in (("DeepSpeed options", DeepSpeedConfig, "ds"), ("FSDP options", FSDPConfig, "fsdp")):
        group = parser.add_argument_group(title)
        for f in dataclasses.fields(schema):
            if f.name != "gradient_accumulation_steps":  # the general flag (above) also feeds DeepSpeed
                _add_field_flag(group, f, f"{prefix}:{f.name}")
    _add_dynamo_flags(parser.add_argument_group("torch.compile (read by Accelerator() through ACCELERATE_DYNAMO_*)"))
    _add_parallelism_flags(parser.add_argument_group("N-D parallelism (Accelerator() builds a ParallelismConfig)"))
    _add_fp8_flags(parser.add_argument_group("fp8 (with --mixed_precision fp8)"))
    other = parser.add_argument_group("output")
    other.add_argument("--dry_run", "--dry-run", action="store_true", help="print the command and launch spec, start nothing")
    other.add_argument("-q", "--quiet", action="store_true", help="only the script's own output and errors")
    parser.add_argument("--as_accelerate", "--as-accelerate", action="store_true",
                        help="every `import accelerate` in the processes gets hasten (transformers' Trainer, TRL, "
                             f"PEFT, diffusers run on hasten unchanged); also on with {AS_ACCELERATE_ENV}=1")
    parser.add_argument("-m", "--module", action="store_true", help="treat SCRIPT as a Python module name")
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="arguments passed to the script")
    parser.set_defaults(run=run, parser=parser)
    return parser


def resolve_config(args: argparse.Namespace) -> LaunchConfig:
    """Defaults, then the config file, then the flags given on the command line."""
    base = load_config(args.config_file)
    data = to_dict(base)
    given = {name: value for name, value in vars(args).items() if value is not None}
    for f in config_fields(LaunchConfig):
        if f.name in given and not isinstance(given[f.name], (dict, list)):
            data[f.name] = given[f.name]
    for section, prefix, switch in (("deepspeed_config", "ds", "use_deepspeed"), ("fsdp_config", "fsdp", "use_fsdp")):
        options = {key.split(":", 1)[1]: value for key, value in given.items() if key.startswith(f"{prefix}:")}
        if options:
            if not data.get(switch):
                flag = f"--{next(iter(options))}"
                raise ConfigError(f"{flag} is a {'DeepSpeed' if prefix == 'ds' else 'FSDP'} option; add --{switch}.")
            data[section] = {**(data.get(section) or {}), **options}
    nd = {key.split(":", 1)[1]: value for key, value in given.items() if key.startswith("pc:parallelism_config_")}
    if nd or given.get("pc:use"):
        data["parallelism_config"] = {**(data.get("parallelism_config") or {}), **nd}
    fp8 = {key.split(":", 1)[1]: value for key, value in given.items() if key.startswith("fp8:")}
    if fp8:
        data["fp8_config"] = {**(data.get("fp8_config") or {}), **fp8}
    dynamo = {key.split(":", 1)[1]: value for key, value in given.items() if key.startswith("dynamo:")}
    if dynamo:
        data["dynamo_config"] = {**(data.get("dynamo_config") or {}), **dynamo}
    if data.get("use_deepspeed") and args.gradient_accumulation_steps is not None:
        data["deepspeed_config"] = {**(data.get("deepspeed_config") or {}),
                                    "gradient_accumulation_steps": args.gradient_accumulation_steps}
    if args.multi_cpu and args.multi_gpu:
        raise ConfigError("--multi_cpu and --multi_gpu exclude each other; pick one.")
    if args.multi_cpu:
        data["distributed_type"], data["use_cpu"] = "MULTI_CPU", True
    if args.multi_gpu:
        data["distributed_type"] = "MULTI_GPU"
    per_machine = args.num_processes_per_machine
    if per_machine is not None:
        if per_machine < 1:
            raise ConfigError(f"--num_processes_per_machine must be at least 1, got {per_machine}.")
        total = per_machine * int(data.get("num_machines") or 1)
        if args.num_processes is not None and args.num_processes != total:
            raise ConfigError(
                f"--num_processes {args.num_processes} (total) disagrees with --num_processes_per_machine "
                f"{per_machine} on {data.get('num_machines')} machine(s) = {total}; give only one of them."
            )
        data["num_processes"] = total
    if data.get("use_deepspeed"):
        data["distributed_type"] = "DEEPSPEED"
    elif data.get("use_fsdp"):
        data["distributed_type"] = "FSDP"
    return from_dict(data, source="the command line and config file")


def build_plan(args: argparse.Namespace, config: LaunchConfig):
    """The LaunchPlan for a resolved config and the script to run."""
    from ..launch.plan import LaunchPlan
    from ..process.launch_spec import LaunchSpec

    if args.gradient_accumulation_steps is not None and args.gradient_accumulation_steps < 1:
        raise ConfigError(f"--gradient_accumulation_steps must be at least 1, got {args.gradient_accumulation_steps}.")
    _check_precision(config)
    dynamo = dynamo_settings(config.dynamo_config)
    if dynamo is not None:
        from ..options.enums import DynamoBackend

        if dynamo["backend"] not in {b.value for b in DynamoBackend}:
            raise ConfigError(f"dynamo_backend {dynamo['backend'].lower()!r} is not a torch.compile backend Accelerate "
                              f"names; use one of {', '.join(b.value.lower() for b in DynamoBackend)}.")
    parallelism = parallelism_settings(config.parallelism_config) if config.parallelism_config else None
    _check_parallelism(parallelism, config.num_processes)
    spec = LaunchSpec(
        mixed_precision=config.mixed_precision,
        cpu=config.use_cpu,
        debug=config.debug,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        deepspeed=dataclasses.asdict(config.deepspeed) if config.use_deepspeed else None,
        fsdp=dataclasses.asdict(config.fsdp) if config.use_fsdp else None,
        dynamo=dynamo,
        parallelism=parallelism,
        fp8=_fp8_env(config),
    )
    return LaunchPlan(
        target=args.script,
        target_args=tuple(args.script_args),
        module=args.module,
        num_processes=config.num_processes,
        num_machines=config.num_machines,
        machine_rank=config.machine_rank,
        main_process_ip=config.main_process_ip,
        main_process_port=config.main_process_port,
        rdzv_backend=config.rdzv_backend,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        liveness_timeout=config.liveness_timeout,
        mpirun=config.mpirun,
        mpirun_hostfile=config.mpirun_hostfile,
        gpu_ids=config.gpu_ids,
        network_interface=config.network_interface,
        quiet=args.quiet,
        spec=spec,
    ).validate()


def _fp8_env(config: LaunchConfig) -> dict[str, str] | None:
    """The fp8 settings' ACCELERATE_FP8_* variables; refused unless the run trains in fp8 (they would do nothing)."""
    if not config.fp8_config:
        return None
    try:
        env = fp8_settings(config.fp8_config)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if config.mixed_precision != "fp8":
        raise ConfigError(f"fp8 settings were given but mixed_precision is {config.mixed_precision!r}; add "
                          "--mixed_precision fp8, or drop the fp8 settings.")
    return env


def _check_parallelism(parallelism: dict[str, str] | None, num_processes: int) -> None:
    """Sizes that cannot cover the processes, refused before anything starts (Accelerate finds out in every process)."""
    if not parallelism:
        return
    try:
        sizes = {key: int(parallelism.get(key, "1")) for key in ("dp_replicate_size", "dp_shard_size", "tp_size",
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


def _check_precision(config: LaunchConfig) -> None:
    """Refuse a precision the chosen devices cannot do, before starting anything."""
    if config.mixed_precision != "bf16" or config.use_cpu:
        return
    from ..launch.gpus import gpu_compute_capabilities

    capabilities = gpu_compute_capabilities()
    old = [index for index, capability in enumerate(capabilities) if capability < (8, 0)]
    if capabilities and old:
        raise ConfigError(
            f"--mixed_precision bf16 needs GPUs of compute capability 8.0 or newer, but GPU(s) {old} are older; "
            "use --mixed_precision fp16."
        )


def main(argv: list[str]) -> int:
    """`hasten launch ARGV...` as a function (what `hasten test` calls); returns the process exit code.

    Example:
        >>> _ = open("train.py", "w").write("print('hello')")
        >>> main(["--dry_run", "--cpu", "train.py"])  # doctest: +ELLIPSIS
        HASTEN_LAUNCH_SPEC=... -m hasten.launch.worker train.py
        0
    """
    from .parsing import ConciseParser, run_command

    parser = ConciseParser(prog="hasten")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ConciseParser))
    return run_command(parser, ["launch", *argv])


def unused_settings(config: LaunchConfig) -> list[tuple[str, str]]:
    """Compatibility keys of the config file that hold a value hasten does not use: (name, what it is for).

    Example:
        >>> unused_settings(from_dict({"tpu_name": "pod-1"}, source="example"))
        [('tpu_name', 'TPU only')]
    """
    return [(f.name, f.metadata["help"]) for f in config_fields(LaunchConfig, include_ignored=True)
            if f.metadata["ignored"] and getattr(config, f.name) != default_of(f)]


def run(args: argparse.Namespace) -> int:
    """Run `hasten launch` for parsed arguments."""
    from ..launch.plan import LaunchError

    try:
        config = resolve_config(args)
        plan = build_plan(args, config)
    except (ConfigError, LaunchError) as error:
        sys.stderr.write(f"hasten launch: error: {error}\n")
        return 2
    if not args.quiet:
        for name, help_text in unused_settings(config):
            sys.stderr.write(f"hasten launch: note: the config file's {name} ({help_text}) is not used by hasten; "
                             f"remove it from the file to silence this note.\n")
    if args.dry_run:
        print(plan.describe())
        return 0
    if args.as_accelerate or os.environ.get(AS_ACCELERATE_ENV) == "1":
        from ..process.aliasing import install

        install()  # here first: a single process runs the script in this one; the workers inherit PYTHONPATH
    from ..launch.run import execute

    return execute(plan)


__all__ = ["add_parser", "resolve_config", "build_plan", "unused_settings", "main"]
