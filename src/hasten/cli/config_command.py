"""`hasten config`: the questionnaire, `hasten config default` and `hasten config update`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..launch.config import (
    ConfigError,
    DeepSpeedConfig,
    FSDPConfig,
    LaunchConfig,
    default_config_path,
    from_dict,
    load_config,
    read_raw,
    save_config,
    to_dict,
)
from ..launch.config_migration import migrate
from ..process.launch_spec import CONFIG_FILE_ENV, EXIT_INTERRUPTED, MIXED_PRECISION_CHOICES, fp8_problem
from . import prompts

_MACHINE_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "TPU")
_MACHINE_LABELS = ("No distributed training (one process)", "multi-CPU", "multi-GPU", "TPU")
_ENVIRONMENT_LABELS = {"LOCAL_MACHINE": "This machine", "CLUSTER": "A cluster (several machines)"}


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "config",
        help="answer a few questions once; `hasten launch` then runs as configured",
        description=(
            "Ask questions about this machine and write a launch config file.\n"
            f"Default file: {default_config_path()} (set ${CONFIG_FILE_ENV} or pass --config_file)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config_file", "--config-file", default=None, metavar="PATH",
                        help="where to write the file (default: the path above)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    default = actions.add_parser("default", help="write a sensible config without questions (detects the hardware)")
    default.add_argument("--config_file", "--config-file", dest="sub_config_file", default=None, metavar="PATH")
    default.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISION_CHOICES, default="no")
    default.add_argument("--force", action="store_true", help="overwrite an existing file")
    update = actions.add_parser("update", help="rewrite an older (or Accelerate) config file in the current layout")
    update.add_argument("--config_file", "--config-file", dest="sub_config_file", default=None, metavar="PATH")
    parser.set_defaults(run=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    path = Path(getattr(args, "sub_config_file", None) or args.config_file or default_config_path())
    try:
        if args.action == "default":
            return write_default(path, args.mixed_precision, args.force)
        if args.action == "update":
            return update(path)
        return questionnaire(path)
    except ConfigError as error:
        sys.stderr.write(f"hasten config: error: {error}\n")
        return 2


# ---------------------------------------------------------------------------- default / update
def detect_hardware() -> tuple[int, int]:
    """(number of CUDA GPUs, number of CPU cores available to this process)."""
    from ..launch.plan import available_cpus

    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch or a broken driver: treat as no GPU
        gpus = 0
    return gpus, available_cpus()


def default_config(gpus: int, mixed_precision: str = "no") -> LaunchConfig:
    """One process per GPU when there are several; otherwise a single process.

    Example:
        >>> default_config(gpus=4).num_processes
        4
        >>> default_config(gpus=0).distributed_type
        'NO'
    """
    if gpus > 1:
        return LaunchConfig(distributed_type="MULTI_GPU", num_processes=gpus, mixed_precision=mixed_precision).validate()
    return LaunchConfig(distributed_type="NO", num_processes=1, use_cpu=gpus == 0, mixed_precision=mixed_precision).validate()


def write_default(path: Path, mixed_precision: str, force: bool) -> int:
    if path.exists() and not force:
        sys.stderr.write(f"hasten config: error: {path} already exists; pass --force to overwrite it.\n")
        return 2
    gpus, cpus = detect_hardware()
    save_config(default_config(gpus, mixed_precision), path)
    print(f"hasten config: wrote {path} ({gpus} GPU(s), {cpus} CPU core(s) detected).")
    return 0


def update(path: Path) -> int:
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist; create it with `hasten config`.")
    raw = read_raw(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values.")
    config = from_dict(raw, source=f"config file {str(path)!r}")
    migrated = migrate(raw)
    changed = sorted(set(raw) ^ set(migrated)) + sorted(k for k in set(raw) & set(migrated) if raw[k] != migrated[k])
    save_config(config, path)
    detail = f"; migrated keys: {', '.join(changed)}" if changed else ""
    print(f"hasten config: updated {path} to the current layout{detail}.")
    return 0


# ---------------------------------------------------------------------------- the questionnaire
def _question(schema: type[Any], name: str) -> str:
    return schema.__dataclass_fields__[name].metadata["question"]


def _choices(schema: type[Any], name: str) -> tuple[Any, ...]:
    return schema.__dataclass_fields__[name].metadata["choices"]


def ask_answers(defaults: LaunchConfig | None = None, gpus: int | None = None) -> LaunchConfig:
    """Ask the questions (defaults from `defaults`, i.e. the existing file) and return the validated config."""
    d = defaults or LaunchConfig()
    if gpus is None:
        gpus = detect_hardware()[0]
    Q = LaunchConfig
    answers: dict[str, Any] = {}
    environment = prompts.ask_choice(
        _question(Q, "compute_environment"), list(_ENVIRONMENT_LABELS), d.compute_environment
        if d.compute_environment in _ENVIRONMENT_LABELS else "LOCAL_MACHINE", list(_ENVIRONMENT_LABELS.values()),
    )
    answers["compute_environment"] = environment
    # A DeepSpeed / FSDP file was answered "multi-GPU" (then "yes" to DeepSpeed / FSDP).
    default_type = "MULTI_GPU" if d.distributed_type in ("DEEPSPEED", "FSDP") else d.distributed_type
    default_type = default_type if default_type in _MACHINE_TYPES else "NO"
    while True:
        machine = prompts.ask_choice(_question(Q, "distributed_type"), _MACHINE_TYPES, default_type, _MACHINE_LABELS)
        if machine != "TPU":
            break
        print("  hasten does not support TPUs; choose another machine type.")
    answers["distributed_type"] = machine
    distributed = machine != "NO"
    if distributed:
        machines = prompts.ask_int(_question(Q, "num_machines"), d.num_machines if environment == "CLUSTER" else 1, minimum=1)
        answers["num_machines"] = machines
        if machines > 1:
            answers["machine_rank"] = prompts.ask_int(_question(Q, "machine_rank"), min(d.machine_rank, machines - 1),
                                                      minimum=0, maximum=machines - 1)
            answers["main_process_ip"] = prompts.ask(_question(Q, "main_process_ip"), _non_empty,
                                                     d.main_process_ip or "")
            answers["main_process_port"] = prompts.ask_int(_question(Q, "main_process_port"),
                                                           d.main_process_port or 29500, minimum=1, maximum=65535)
            answers["rdzv_backend"] = prompts.ask_choice(_question(Q, "rdzv_backend"), _choices(Q, "rdzv_backend"),
                                                         d.rdzv_backend)
            answers["same_network"] = prompts.ask_bool(_question(Q, "same_network"), d.same_network)
    if machine == "MULTI_CPU":
        answers["mpirun"] = prompts.ask_bool(_question(Q, "mpirun"), d.mpirun)
        if answers["mpirun"]:
            answers["mpirun_hostfile"] = prompts.ask_text(_question(Q, "mpirun_hostfile"), d.mpirun_hostfile) or None
    if machine == "MULTI_GPU":
        answers.update(_ask_sharding(d))
        if answers.get("use_deepspeed"):  # the same distributed_type Accelerate writes for these files
            answers["distributed_type"] = "DEEPSPEED"
        elif answers.get("use_fsdp"):
            answers["distributed_type"] = "FSDP"
    if distributed:
        per_machine_default = gpus if machine == "MULTI_GPU" and gpus else 2
        default_total = d.num_processes if d.num_processes > 1 else per_machine_default * answers["num_machines"]
        while True:
            total = prompts.ask_int(_question(Q, "num_processes"), default_total, minimum=1)
            if total % answers["num_machines"] == 0:
                break
            print(f"  {total} processes cannot be split evenly over {answers['num_machines']} machines.")
        answers["num_processes"] = total
    else:
        answers["num_processes"] = 1
    if machine == "MULTI_GPU" or (machine == "NO" and gpus):
        answers["gpu_ids"] = prompts.ask(_question(Q, "gpu_ids"), _gpu_ids, d.gpu_ids or "all")
    if machine == "NO":
        answers["use_cpu"] = prompts.ask_bool(_question(Q, "use_cpu"), d.use_cpu or not gpus)
    elif machine == "MULTI_CPU":
        answers["use_cpu"] = True
    # fp8 is offered only where a backend is installed (else it is refused at launch: launch_spec.fp8_problem)
    usable = tuple(c for c in _choices(Q, "mixed_precision") if c != "fp8" or not fp8_problem())
    answers["mixed_precision"] = prompts.ask_choice(_question(Q, "mixed_precision"), usable,
                                                    d.mixed_precision)
    if distributed:
        answers["debug"] = prompts.ask_bool(_question(Q, "debug"), d.debug)
    return from_dict({**to_dict(LaunchConfig()), **answers}, source="your answers")


def _ask_sharding(d: LaunchConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["use_deepspeed"] = prompts.ask_bool(_question(LaunchConfig, "use_deepspeed"), d.use_deepspeed)
    if out["use_deepspeed"]:
        ds = d.deepspeed
        section: dict[str, Any] = {}
        config_file = prompts.ask_text(_question(DeepSpeedConfig, "deepspeed_config_file"), ds.deepspeed_config_file or "")
        if config_file:
            section["deepspeed_config_file"] = config_file
        else:
            for name in ("zero_stage", "offload_optimizer_device"):
                section[name] = prompts.ask_choice(_question(DeepSpeedConfig, name), _choices(DeepSpeedConfig, name),
                                                   getattr(ds, name))
            if section["zero_stage"] == 3:
                name = "offload_param_device"
                section[name] = prompts.ask_choice(_question(DeepSpeedConfig, name), _choices(DeepSpeedConfig, name),
                                                   getattr(ds, name))
        out["deepspeed_config"] = section
        return out
    out["use_fsdp"] = prompts.ask_bool(_question(LaunchConfig, "use_fsdp"), d.use_fsdp)
    if out["use_fsdp"]:
        fs = d.fsdp
        out["fsdp_config"] = {
            name: prompts.ask_choice(_question(FSDPConfig, name), _choices(FSDPConfig, name), getattr(fs, name))
            for name in ("fsdp_sharding_strategy", "fsdp_auto_wrap_policy", "fsdp_state_dict_type")
        }
    return out


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("an address is needed.")
    return text.strip()


def _gpu_ids(text: str) -> str:
    text = text.replace(" ", "")
    if text == "all" or all(part.isdigit() for part in text.split(",")):
        return text
    raise ValueError(f"{text!r} is neither 'all' nor a comma-separated list of GPU numbers.")


def questionnaire(path: Path) -> int:
    """Ask, then write `path` atomically; Ctrl-C leaves no file (and keeps an existing one)."""
    try:
        existing = load_config(path) if path.exists() else None
    except ConfigError as error:
        print(f"(ignoring the existing file: {error})")
        existing = None
    try:
        config = ask_answers(existing)
    except prompts.Aborted:
        sys.stderr.write("hasten config: aborted; no file was written.\n")
        return EXIT_INTERRUPTED
    save_config(config, path)
    print(f"hasten config: wrote {path}. Start your script with: hasten launch your_script.py")
    return 0

