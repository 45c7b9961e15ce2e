"""The launch configuration: one typed schema for the YAML file, the questionnaire and the launch flags.

Every field is declared once, here, with its type, default, help text and
allowed values (`dataclasses.field(metadata=...)`). `hasten config` asks
questions from it, the launch command's flags of the same names take their
help from it (`cli/launch_flags.py`) and their values over a file's
(`cli/launch_settings.py`), and `load_config` / `save_config` read and
write it. Files written by Hugging
Face Accelerate's `config` command are read with the same key names; an
unknown key is an error naming it.

Nothing here imports torch: `hasten config` and `hasten launch --help`
stay fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, get_args, get_origin

from ..core.errors import ConfigError
from ..strategies.fsdp.plugin import AUTO_WRAP_POLICIES, SHARDING_STRATEGIES, STATE_DICT_TYPES
from ..process.launch_spec import CONFIG_FILE_ENV, MIXED_PRECISION_CHOICES, fp8_problem
from .config_migration import migrate

__all__ = ["ConfigError", "LaunchConfig", "DeepSpeedConfig", "FSDPConfig", "default_config_path", "config_file_to_read",
           "load_config", "save_config", "config_fields"]

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP")
MIXED_PRECISIONS = MIXED_PRECISION_CHOICES  # spelled once, in launch_spec
# A process silent this long is frozen (hasten.launch.liveness): the run ends within a minute of the freeze.
DEFAULT_LIVENESS_TIMEOUT = 45.0
MIN_LIVENESS_TIMEOUT = 3.0  # a heartbeat comes every second: a shorter limit would mistake a late one for a freeze


def option(default: Any, help: str, choices: tuple[Any, ...] | None = None, question: str | None = None,
           flag: str | None = None, ignored: bool = False) -> Any:
    """A schema field: default, help text, allowed values, questionnaire wording, launch flag name.

    `ignored=True` marks keys read for compatibility that hasten does not use
    (TPU, SageMaker, ...): they are accepted in files, never asked, never flags.
    """
    metadata = {"help": help, "choices": choices, "question": question, "flag": flag, "ignored": ignored}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class DeepSpeedConfig:
    """DeepSpeed settings (`deepspeed_config:` in the file, `--zero_stage` etc. on the command line)."""

    deepspeed_config_file: str | None = option(None, "a DeepSpeed JSON config file (overrides the fields below)",
                                               question="DeepSpeed config file (empty to answer the questions instead)")
    zero_stage: int = option(2, "ZeRO stage", choices=(0, 1, 2, 3), question="ZeRO stage")
    offload_optimizer_device: str = option("none", "where ZeRO offloads optimizer states", choices=("none", "cpu", "nvme"),
                                           question="Offload optimizer states to")
    offload_param_device: str = option("none", "where ZeRO-3 offloads parameters", choices=("none", "cpu", "nvme"),
                                       question="Offload parameters to (ZeRO-3)")
    offload_optimizer_nvme_path: str | None = option(None, "NVMe path for optimizer offload")
    offload_param_nvme_path: str | None = option(None, "NVMe path for parameter offload")
    gradient_accumulation_steps: int = option(1, "DeepSpeed gradient accumulation steps")
    gradient_clipping: float | None = option(None, "DeepSpeed gradient clipping (unset: none)")
    zero3_init_flag: bool = option(False, "construct huge models directly sharded (ZeRO-3 init)")
    zero3_save_16bit_model: bool = option(False, "gather a 16-bit model when saving under ZeRO-3")
    deepspeed_multinode_launcher: str = option("pdsh", "how DeepSpeed reaches the other machines (standard: torchrun)",
                                               choices=("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh",
                                                        "slurm"))
    deepspeed_hostfile: str | None = option(None, "DeepSpeed hostfile")
    deepspeed_inclusion_filter: str | None = option(None, "DeepSpeed inclusion filter")
    deepspeed_exclusion_filter: str | None = option(None, "DeepSpeed exclusion filter")
    deepspeed_moe_layer_cls_names: str | None = option(None, "MoE layer class names (comma separated)")


@dataclass
class FSDPConfig:
    """FSDP settings (`fsdp_config:` in the file, `--fsdp_*` on the command line)."""

    fsdp_version: int = option(2, "FSDP version (2 = fully_shard)", choices=(1, 2))
    fsdp_sharding_strategy: str = option("FULL_SHARD", "what FSDP shards",
                                         choices=SHARDING_STRATEGIES,
                                         question="FSDP sharding strategy")
    fsdp_auto_wrap_policy: str = option("TRANSFORMER_BASED_WRAP", "which submodules become FSDP units",
                                        choices=AUTO_WRAP_POLICIES,
                                        question="FSDP auto-wrap policy")
    fsdp_transformer_layer_cls_to_wrap: str | None = option(None, "layer class names to wrap (comma separated)")
    fsdp_min_num_params: int = option(100_000_000, "minimum parameters per unit for SIZE_BASED_WRAP")
    fsdp_state_dict_type: str = option("SHARDED_STATE_DICT", "how checkpoints are saved",
                                       choices=STATE_DICT_TYPES,
                                       question="FSDP state dict type")
    fsdp_offload_params: bool = option(False, "offload parameters to CPU")
    fsdp_backward_prefetch: str | None = option(None, "backward prefetch (FSDP1's; FSDP2 prefetches itself)",
                                                choices=("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"))
    fsdp_forward_prefetch: bool = option(False, "forward prefetch")
    fsdp_use_orig_params: bool = option(True, "keep original parameters (needed for per-parameter optimizer groups)")
    fsdp_cpu_ram_efficient_loading: bool = option(True, "load weights on rank 0 only, then broadcast")
    fsdp_sync_module_states: bool = option(True, "broadcast module states from rank 0")
    fsdp_activation_checkpointing: bool = option(False, "activation checkpointing")
    fsdp_activation_checkpointing_offload: bool = option(False, "offload checkpointed activations to the CPU")
    fsdp_ignored_modules: str | None = option(None, "modules FSDP leaves unsharded (a regular expression of names)")
    fsdp_reshard_after_forward: bool = option(True, "free gathered parameters after forward")


@dataclass
class LaunchConfig:
    """Everything `hasten launch` needs to know; the YAML file holds exactly these keys.

    Example:
        >>> config = LaunchConfig(distributed_type="MULTI_CPU", num_processes=2, use_cpu=True)
        >>> config.validate().processes_per_machine
        2
    """

    compute_environment: str = option("LOCAL_MACHINE", "where the run happens",
                                      choices=("LOCAL_MACHINE", "CLUSTER", "AMAZON_SAGEMAKER"),
                                      question="Which compute environment are you running in?")
    distributed_type: str = option("NO", "kind of run", choices=DISTRIBUTED_TYPES,
                                   question="Which type of machine are you using?")
    num_machines: int = option(1, "number of machines (nodes); MIN:MAX for an elastic run (hasten's extension: the "
                                  "group re-forms with any number of machines in range)",
                               question="How many machines will you use?")
    min_machines: int | None = option(None, "an elastic run's fewest machines (what --num_machines MIN:MAX sets; "
                                            "num_machines is then MAX)")
    machine_rank: int = option(0, "rank of this machine, 0 .. num_machines-1",
                               question="What is the rank of this machine?")
    main_process_ip: str | None = option(None, "address of the machine with rank 0 (the rendezvous)",
                                         question="What is the IP address of the machine that will host the main process?")
    main_process_port: int | None = option(None, "rendezvous port (default: a free one)",
                                           question="What is the port you will use to communicate with the main process?")
    rdzv_backend: str = option("static", "rendezvous backend", choices=("static", "c10d"),
                               question="Which rendezvous backend?")
    same_network: bool = option(True, "all machines are on the same local network",
                                question="Are all the machines on the same local network?")
    network_interface: str | None = option(None, "network interface for gloo/NCCL (default: the one routing to main_process_ip)")
    num_processes: int = option(1, "processes in total, across all machines",
                                question="How many processes in total (across all machines) should be used?")
    gpu_ids: str = option("all", "GPUs to use on this machine, comma separated, e.g. '0,1' (default: all)",
                          question="Which GPU ids should be used (comma separated, or 'all')?")
    use_cpu: bool = option(False, "compute on the CPU even if GPUs are present",
                           question="Do you want to run on the CPU only (even if GPUs are available)?")
    mixed_precision: str = option("no", "mixed precision", choices=MIXED_PRECISIONS,
                                  question="Do you wish to use mixed precision?")
    debug: bool = option(False, "check tensor shapes across ranks before collectives",
                         question="Should distributed operations be checked while running for errors (debug mode)?")
    max_restarts: int = option(0, "restart the whole group this many times after a failure (elastic)")
    monitor_interval: float = option(0.1, "seconds between health checks of the processes (elastic)")
    liveness_timeout: float = option(DEFAULT_LIVENESS_TIMEOUT, "seconds a process may show no sign of life "
                                     "(stopped, hung in the kernel) before the run ends naming it; 0: never")
    mpirun: bool = option(False, "start the processes with Open MPI's mpirun instead of torchrun (multi-CPU)",
                          question="Start the processes with mpirun (Open MPI) instead of torchrun?")
    mpirun_hostfile: str | None = option(None, "hostfile for mpirun",
                                         question="mpirun hostfile (empty for this machine only)")
    use_deepspeed: bool = option(False, "use DeepSpeed", question="Do you want to use DeepSpeed?")
    use_fsdp: bool = option(False, "use Fully Sharded Data Parallel", question="Do you want to use FullyShardedDataParallel?")
    deepspeed_config: dict = option({}, "DeepSpeed settings (see DeepSpeedConfig)")
    fsdp_config: dict = option({}, "FSDP settings (see FSDPConfig)")
    main_training_function: str = option("main", "function notebook launches call")
    enable_cpu_affinity: bool = option(False, "pin each process to the CPU cores next to its GPU (NVIDIA, AMD)")
    # Accepted for compatibility with Accelerate's files; hasten does not use them.
    downcast_bf16: bool = option(False, "TPU only", ignored=True)
    dynamo_config: dict = option({}, "torch.compile settings (dynamo_backend, dynamo_mode, dynamo_use_fullgraph, "
                                     "dynamo_use_dynamic, dynamo_use_regional_compilation)")
    fp8_config: dict = option({}, "fp8 settings (backend, pad_inner_dim, enable_fsdp_float8_all_gather and Transformer "
                                  "Engine's; each key with or without the fp8_ prefix)")
    megatron_lm_config: dict = option({}, "Megatron-LM settings", ignored=True)
    parallelism_config: dict = option({}, "N-D parallelism sizes (parallelism_config_dp_replicate_size, ..._dp_shard_size, "
                                          "..._tp_size, ..._cp_size, ..._sp_size and their options)")
    tp_config: dict = option({}, "tensor parallelism settings", ignored=True)
    ipex_config: dict = option({}, "IPEX settings", ignored=True)
    mpirun_config: dict = option({}, "read into mpirun_hostfile", ignored=True)
    tpu_name: str | None = option(None, "TPU only", ignored=True)
    tpu_zone: str | None = option(None, "TPU only", ignored=True)
    tpu_use_cluster: bool = option(False, "TPU only", ignored=True)
    tpu_use_sudo: bool = option(False, "TPU only", ignored=True)
    tpu_vm: list = option([], "TPU only", ignored=True)
    tpu_env: list = option([], "TPU only", ignored=True)
    command_file: str | None = option(None, "TPU only", ignored=True)
    commands: list = option([], "TPU only", ignored=True)

    # -- derived ----------------------------------------------------------------
    @property
    def processes_per_machine(self) -> int:
        return self.num_processes // self.num_machines

    @property
    def deepspeed(self) -> DeepSpeedConfig:
        return DeepSpeedConfig(**section_values(DeepSpeedConfig, self.deepspeed_config, "deepspeed_config"))

    @property
    def fsdp(self) -> FSDPConfig:
        return FSDPConfig(**section_values(FSDPConfig, self.fsdp_config, "fsdp_config"))

    def validate(self) -> "LaunchConfig":
        """Refuse impossible combinations with one sentence each; returns self."""
        for f in fields(self):
            _check_value(f, getattr(self, f.name), f.name)
        check_layout(self.num_processes, self.num_machines, self.machine_rank, self.main_process_ip,
                     self.main_process_port)
        if self.min_machines is not None:
            if not 1 <= self.min_machines <= self.num_machines:
                raise ConfigError(f"min_machines must be between 1 and num_machines ({self.num_machines}), got "
                                  f"{self.min_machines}; write --num_machines MIN:MAX.")
            if self.mpirun:
                raise ConfigError("an elastic run (--num_machines MIN:MAX) is started by torch's elastic agent; drop "
                                  "--mpirun, or give a fixed --num_machines.")
        if self.mixed_precision == "fp8" and (problem := fp8_problem()):
            raise ConfigError(problem)
        if self.use_deepspeed and self.use_fsdp:
            raise ConfigError("DeepSpeed and FSDP cannot be used together; choose one of use_deepspeed or use_fsdp.")
        if self.mpirun and (self.use_deepspeed or self.use_fsdp):
            raise ConfigError("mpirun starts plain multi-CPU runs only; drop mpirun or DeepSpeed/FSDP.")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be 0 or more, got {self.max_restarts}.")
        if self.liveness_timeout != 0 and not self.liveness_timeout >= MIN_LIVENESS_TIMEOUT:
            raise ConfigError(f"liveness_timeout must be 0 (never) or at least {MIN_LIVENESS_TIMEOUT:g} seconds, "
                              f"got {self.liveness_timeout:g}.")
        self.deepspeed, self.fsdp  # noqa: B018 - validates the nested sections
        return self


def check_layout(num_processes: int, num_machines: int, machine_rank: int, main_process_ip: str | None,
                 main_process_port: int | None) -> None:
    """Refuse an impossible process layout in one sentence (shared by configs and launch plans).

    Example:
        >>> check_layout(3, 2, 0, "10.0.0.1", None)
        Traceback (most recent call last):
        ...
        hasten.core.errors.ConfigError: num_processes 3 (the total across machines) is not divisible by num_machines 2; give every machine the same number of processes.
    """
    if num_machines < 1:
        raise ConfigError(f"num_machines must be at least 1, got {num_machines}.")
    if num_processes < 1:
        raise ConfigError(f"num_processes must be at least 1, got {num_processes}.")
    if not 0 <= machine_rank < num_machines:
        raise ConfigError(
            f"machine_rank {machine_rank} is not below num_machines {num_machines}; "
            f"use a rank from 0 to {num_machines - 1}."
        )
    if num_processes % num_machines:
        raise ConfigError(
            f"num_processes {num_processes} (the total across machines) is not divisible by "
            f"num_machines {num_machines}; give every machine the same number of processes."
        )
    if main_process_port is not None and not 0 <= main_process_port < 65536:
        raise ConfigError(f"main_process_port must be between 1 and 65535 (or 0: a free one), got {main_process_port}.")
    if num_machines > 1 and not main_process_ip:
        raise ConfigError("a run on several machines needs main_process_ip (the address of the machine with rank 0).")


# ---------------------------------------------------------------------------- field helpers
def config_fields(schema: type = LaunchConfig, include_ignored: bool = False) -> list[dataclasses.Field]:
    """The schema's fields (without the compatibility-only ones unless asked)."""
    return [f for f in fields(schema) if include_ignored or not f.metadata.get("ignored")]


def field_type(f: dataclasses.Field) -> type:
    """The plain Python type of a field: `int | None` -> int."""
    annotation = f.type if not isinstance(f.type, str) else eval(f.type, {}, {})  # noqa: S307 - our own annotations
    if get_origin(annotation) is not None and type(None) in get_args(annotation):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def coerce(f: dataclasses.Field, value: Any, where: str) -> Any:
    """Convert a YAML/CLI/answer value to the field's type, or raise ConfigError naming `where`."""
    if value is None:
        return None
    kind = field_type(f)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "yes", "y", "1"):
                return True
            if text in ("false", "no", "n", "0"):
                return False
            raise ValueError
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind is float:
            return float(value)
        if kind is str:
            if isinstance(value, bool):  # unquoted YAML `no` / `yes` (e.g. `mixed_precision: no`) arrives as a bool
                word = "yes" if value else "no"
                return next((c for c in f.metadata.get("choices") or () if str(c).lower() == word), str(value).lower())
            if isinstance(value, list) and "comma separated" in f.metadata.get("help", ""):
                return ",".join(str(item) for item in value)  # `gpu_ids: [0, 1]` -> "0,1"
            if isinstance(value, (list, dict)):
                raise ValueError
            # a choice in another case (`full_shard`, `CPU`) is that choice
            return next((c for c in f.metadata.get("choices") or () if str(c).lower() == str(value).lower()), str(value))
        if kind in (dict, list):
            if not isinstance(value, kind):
                raise ValueError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r} is not a valid {kind.__name__}.") from None
    return value


def _check_value(f: dataclasses.Field, value: Any, where: str) -> None:
    choices = f.metadata.get("choices")
    if choices and value is not None and value not in choices:
        raise ConfigError(f"{where}={value!r} is not one of {', '.join(map(repr, choices))}.")


def section_values(schema: type, data: Mapping[str, Any] | None, section: str) -> dict[str, Any]:
    """A section's keys (`deepspeed_config`, `fsdp_config`), each converted to its schema type and checked.

    Example:
        >>> section_values(FSDPConfig, {"fsdp_offload_params": "false", "fsdp_sharding_strategy": "full_shard"}, "fsdp")
        {'fsdp_offload_params': False, 'fsdp_sharding_strategy': 'FULL_SHARD'}
    """
    known = {f.name: f for f in fields(schema)}
    values = {}
    for key, value in (data or {}).items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {section}.{close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {section}.{key}{hint}; known keys: {', '.join(sorted(known))}.")
        values[key] = coerce(known[key], value, f"{section}.{key}")
        _check_value(known[key], values[key], f"{section}.{key}")
    return values


def from_dict(data: Mapping[str, Any], source: str = "config") -> LaunchConfig:
    """Build and validate a LaunchConfig from a mapping (after migration).

    Example:
        >>> from_dict({"num_processes": 2, "distributed_type": "MULTI_CPU"}).num_processes
        2
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source} must be a mapping of keys to values, not a {type(data).__name__}.")
    try:
        data = migrate(data)
    except ValueError as error:  # e.g. a num_machines range that is no range
        raise ConfigError(f"{error} ({source})") from None
    known = {f.name: f for f in fields(LaunchConfig)}
    values = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {key!r} in {source}{hint}; remove it or fix its name.")
        if value is None and not _optional(known[key]):
            continue  # `mixed_precision: null` etc.: the default, not None
        values[key] = coerce(known[key], value, key)
    return LaunchConfig(**values).validate()


def _optional(f: dataclasses.Field) -> bool:
    annotation = f.type if not isinstance(f.type, str) else eval(f.type, {}, {})  # noqa: S307 - our own annotations
    return get_origin(annotation) is not None and type(None) in get_args(annotation)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (calling its factory for lists and dicts)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]


def to_dict(config: LaunchConfig) -> dict[str, Any]:
    """The keys worth writing: every used field, and compatibility fields only when they were set."""
    return {
        f.name: getattr(config, f.name)
        for f in fields(config)
        if not (f.metadata.get("ignored") and getattr(config, f.name) == default_of(f))
    }


# ---------------------------------------------------------------------------- files
def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """`$HASTEN_CONFIG_FILE`, else `$XDG_CONFIG_HOME/hasten/default_config.yaml` (~/.config/...).

    Example:
        >>> default_config_path({"HASTEN_CONFIG_FILE": "/tmp/x.yaml"})
        PosixPath('/tmp/x.yaml')
    """
    env = os.environ if env is None else env
    if env.get(CONFIG_FILE_ENV):
        return Path(env[CONFIG_FILE_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME", os.path.expanduser("~")), ".config")
    return Path(base) / "hasten" / "default_config.yaml"


def config_file_to_read(explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The file a launch reads: `explicit`, else hasten's default file, else Accelerate's; None when none exists.

    Example:
        >>> config_file_to_read("c.yaml")
        PosixPath('c.yaml')
    """
    from .accelerate_config_file import default_config_file

    if explicit is not None:
        return Path(explicit)
    return next((path for path in (default_config_path(env), Path(default_config_file)) if path.is_file()), None)


def read_raw(path: str | os.PathLike[str]) -> Any:
    """The file's parsed YAML/JSON content, unvalidated; a syntax error names the line."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
        return (yaml.safe_load(text) if text.strip() else {}) or {}
    except yaml.YAMLError as error:
        mark, start = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        if mark and start and start.line != mark.line:  # e.g. an unclosed quote or bracket
            where += f" (in what starts at line {start.line + 1})"
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}; fix it or rewrite it with `hasten config`.") from None
    except OSError as error:
        raise ConfigError(f"cannot read config file {str(path)!r}: {error.strerror}.") from None


def load_config(path: str | os.PathLike[str] | None = None, required: bool = False) -> LaunchConfig:
    """Read a YAML (or JSON) config file; the default path when `path` is None.

    A missing default file gives the defaults; a missing explicit file
    (or `required=True`) is an error.
    """
    explicit = path is not None
    path = Path(path) if path is not None else default_config_path()
    if not path.exists():
        if explicit or required:
            raise ConfigError(f"config file {str(path)!r} does not exist; create it with `hasten config`.")
        return LaunchConfig()
    data = read_raw(path)
    source = f"config file {str(path)!r}"
    try:
        return from_dict(data, source=source)
    except ConfigError as error:
        if source in str(error):
            raise
        raise ConfigError(f"{source}: {error}") from None


def save_config(config: LaunchConfig, path: str | os.PathLike[str] | None = None) -> Path:
    """Write the config atomically as YAML (JSON when the name ends in .json); returns the path.

    The file's mode follows the umask, as for every file hasten writes.

    Example:
        >>> import tempfile
        >>> save_config(LaunchConfig(), Path(tempfile.mkdtemp()) / "c.yaml").name
        'c.yaml'
    """
    import json

    import yaml

    from ..core.atomic import atomic_write_text

    path = Path(path) if path is not None else default_config_path()
    config.validate()
    data = to_dict(config)
    text = json.dumps(data, indent=2) + "\n" if path.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    atomic_write_text(path, text)
    return path
