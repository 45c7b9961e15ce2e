"""The launcher -> worker contract: the one typed value a launcher hands to every process, and its names.

Settings travel as a single JSON blob in one environment variable, instead
of a dozen loosely typed variables spread across modules; each process
decodes it once (`LaunchSpec.current`), and explicit `Accelerator`
arguments win over it. Every other ``HASTEN_*`` variable (what a hasten
launcher passes to its processes, and the settings a user may choose
through the environment, with the one function that reads each), the
peer's variables a launcher exports (`LaunchSpec.peer_env`) and the exit
codes processes answer with are named here too, once, so launcher, worker
and docs can only disagree in one file. docs/troubleshooting.md lists the
variables (a test keeps the list complete).

Exit codes: `EXIT_PREEMPTED` (75, a checkpoint was saved: start the run
again), `EXIT_FAILED` (1), `EXIT_INTERRUPTED` (130, Ctrl-C).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

if TYPE_CHECKING:
    from .elastic import ElasticSizes


__all__ = ["LaunchSpec", "LiveSettings", "SPEC_ENV_VAR", "MACHINE_ENV", "BOARD_DIR_ENV", "PROGRESS_FILE_ENV", "PREEMPTION_RECORD_ENV",
           "HEARTBEAT_DIR_ENV", "DEBUG_ENV", "WATCHDOG_ENV", "CPU_FP16_ENV", "LOG_LEVEL_ENV", "PEER_LOG_LEVEL_ENV",
           "INIT_INCLUDE_BUFFERS_ENV", "PEER_INIT_INCLUDE_BUFFERS_ENV", "CONFIG_FILE_ENV", "NO_ARROW_MENU_ENV", "AS_ACCELERATE_ENV",
           "PEER_TORCH_DEVICE_ENV", "torch_device_from_env",
           "RESTART_COUNT_VAR", "MAX_RESTARTS_VAR", "EXIT_PREEMPTED", "EXIT_FAILED", "EXIT_INTERRUPTED",
           "MIXED_PRECISION_CHOICES", "fp8_problem", "debug_requested", "watchdog_enabled", "cpu_fp16_enabled",
           "log_level_from_env"]

# -- what a hasten launcher sets for the processes it starts (not settings: a user never sets them)
SPEC_ENV_VAR = "HASTEN_LAUNCH_SPEC"  # the `LaunchSpec`, as JSON
BOARD_DIR_ENV = "HASTEN_BOARD_DIR"  # shared-memory directory of the mismatch check's board (all ranks on one machine)
PROGRESS_FILE_ENV = "HASTEN_PROGRESS_FILE"  # touched by the main process after its first training batch
PREEMPTION_RECORD_ENV = "HASTEN_PREEMPTION_RECORD"  # where the main process writes what a preemption saved
MACHINE_ENV = "HASTEN_MACHINE"  # an elastic run's name for this machine ("host/machine_rank"): who left or joined
HEARTBEAT_DIR_ENV = "HASTEN_HEARTBEAT_DIR"  # where each process's heartbeat file goes (`hasten.process.heartbeat`)
# -- settings a user may choose through the environment, read in each process (by the functions below)
DEBUG_ENV = "HASTEN_DEBUG"  # debug mode, as `hasten launch --debug` (any value but "" or "0")
WATCHDOG_ENV = "HASTEN_WATCHDOG"  # "0": no deadlock watchdog thread
CPU_FP16_ENV = "HASTEN_CPU_FP16"  # "1"/"true": real fp16 autocast on the CPU instead of full precision
LOG_LEVEL_ENV = "HASTEN_LOG_LEVEL"  # level of `get_logger` loggers given none
PEER_LOG_LEVEL_ENV = "ACCELERATE_LOG_LEVEL"  # the peer's name for it, read after ours
INIT_INCLUDE_BUFFERS_ENV = "HASTEN_INIT_INCLUDE_BUFFERS"  # a true flag: `init_empty_weights` puts buffers on meta too
PEER_INIT_INCLUDE_BUFFERS_ENV = "ACCELERATE_INIT_INCLUDE_BUFFERS"  # the peer's name for it
AS_ACCELERATE_ENV = "HASTEN_AS_ACCELERATE"  # "1": `import accelerate` gets hasten (`hasten.process.aliasing`; set by the switch)
PEER_TORCH_DEVICE_ENV = "ACCELERATE_TORCH_DEVICE"  # the peer's override of the device a process computes on ("cuda:3")
PEER_CPU_AFFINITY_ENV = "ACCELERATE_CPU_AFFINITY"  # a true flag: pin each process to the CPU cores next to its GPU
# -- settings of hasten's commands (never read inside a launched process)
CONFIG_FILE_ENV = "HASTEN_CONFIG_FILE"  # the config file of `hasten launch` / `hasten config`
NO_ARROW_MENU_ENV = "HASTEN_NO_ARROW_MENU"  # any value but "" or "0": `hasten config` asks with numbered lists
# -- torch's elastic agent sets these; `LaunchSpec.peer_env` adds hasten's own restarts to them
RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"  # restarts before the attempt this process belongs to
MAX_RESTARTS_VAR = "TORCHELASTIC_MAX_RESTARTS"

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the run stopped early and resumes when started again
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
# The one list of mixed precision choices (flags, config files, Accelerator); "fp8" needs a backend (`fp8_problem`).
MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")


def fp8_problem() -> str | None:
    """The one sentence that refuses mixed_precision="fp8" when no fp8 backend is installed, else None.

    It imports nothing (usable before torch is loaded); the fp8 training
    itself is `hasten.fp8`'s.

    Example:
        >>> fp8_problem() is None or fp8_problem().startswith("mixed_precision='fp8'")
        True
    """
    from importlib.util import find_spec

    if find_spec("torchao") is None and find_spec("transformer_engine") is None:
        return ("mixed_precision='fp8' needs torchao or NVIDIA Transformer Engine and neither is installed; "
                "install one (pip install torchao) or use mixed_precision='bf16'.")
    return None


def debug_requested(env: Mapping[str, str] | None = None) -> bool:
    """Debug mode: the launch spec's `debug` (``hasten launch --debug``), else `DEBUG_ENV` set (not "" or "0").

    Example:
        >>> debug_requested({DEBUG_ENV: "1"}), debug_requested({DEBUG_ENV: "0"})
        (True, False)
    """
    spec = LaunchSpec.current() if env is None else LaunchSpec.from_env(env)
    env = os.environ if env is None else env
    return spec.debug or env.get(DEBUG_ENV, "") not in ("", "0")


def cpu_affinity_requested(env: Mapping[str, str] | None = None) -> bool:
    """NUMA pinning asked for: the spec's `cpu_affinity` (``--enable_cpu_affinity``), else `PEER_CPU_AFFINITY_ENV`
    set to a true value, as Accelerate's `PartialState` reads it.

    Example:
        >>> cpu_affinity_requested({PEER_CPU_AFFINITY_ENV: "1"}), cpu_affinity_requested({PEER_CPU_AFFINITY_ENV: "no"})
        (True, False)
    """
    spec = LaunchSpec.current() if env is None else LaunchSpec.from_env(env)
    env = os.environ if env is None else env
    return spec.cpu_affinity or env.get(PEER_CPU_AFFINITY_ENV, "").lower() in ("1", "true", "yes", "y", "on", "t")


def watchdog_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether a process runs the deadlock watchdog thread: yes unless `WATCHDOG_ENV` is "0".

    Example:
        >>> watchdog_enabled({}), watchdog_enabled({WATCHDOG_ENV: "0"})
        (True, False)
    """
    env = os.environ if env is None else env
    return env.get(WATCHDOG_ENV, "1") != "0"


def cpu_fp16_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether fp16 on the CPU really autocasts (`CPU_FP16_ENV` "1" or "true"); else it trains in full precision.

    Example:
        >>> cpu_fp16_enabled({CPU_FP16_ENV: "true"}), cpu_fp16_enabled({})
        (True, False)
    """
    env = os.environ if env is None else env
    return env.get(CPU_FP16_ENV, "") in ("1", "true")


def log_level_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The log level the environment asks for: `LOG_LEVEL_ENV`, else `PEER_LOG_LEVEL_ENV` (None: neither set).

    Example:
        >>> log_level_from_env({PEER_LOG_LEVEL_ENV: "INFO"})
        'INFO'
    """
    env = os.environ if env is None else env
    return next((env[name] for name in (LOG_LEVEL_ENV, PEER_LOG_LEVEL_ENV) if env.get(name)), None)


def torch_device_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The device the environment names for this process (`PEER_TORCH_DEVICE_ENV`), or None to choose it as usual.

    Example:
        >>> torch_device_from_env({PEER_TORCH_DEVICE_ENV: "cuda:3"}), torch_device_from_env({})
        ('cuda:3', None)
    """
    env = os.environ if env is None else env
    return env.get(PEER_TORCH_DEVICE_ENV) or None


# Accelerate's variable -> the config field it carries (FSDPConfig / DeepSpeedConfig in hasten.launch.config).
_FSDP_VARIABLES = {
    "FSDP_VERSION": "fsdp_version", "FSDP_SHARDING_STRATEGY": "fsdp_sharding_strategy",
    "FSDP_RESHARD_AFTER_FORWARD": "fsdp_reshard_after_forward", "FSDP_OFFLOAD_PARAMS": "fsdp_offload_params",
    "FSDP_MIN_NUM_PARAMS": "fsdp_min_num_params", "FSDP_AUTO_WRAP_POLICY": "fsdp_auto_wrap_policy",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_transformer_layer_cls_to_wrap",
    "FSDP_BACKWARD_PREFETCH": "fsdp_backward_prefetch", "FSDP_STATE_DICT_TYPE": "fsdp_state_dict_type",
    "FSDP_FORWARD_PREFETCH": "fsdp_forward_prefetch", "FSDP_USE_ORIG_PARAMS": "fsdp_use_orig_params",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "fsdp_cpu_ram_efficient_loading",
    "FSDP_SYNC_MODULE_STATES": "fsdp_sync_module_states",
    "FSDP_ACTIVATION_CHECKPOINTING": "fsdp_activation_checkpointing",
    "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "fsdp_activation_checkpointing_offload",
    "FSDP_IGNORED_MODULES": "fsdp_ignored_modules",
}
_DEEPSPEED_VARIABLES = {
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "gradient_accumulation_steps",
    "ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "offload_optimizer_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "offload_param_device",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "zero3_save_16bit_model",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "deepspeed_config_file",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "deepspeed_moe_layer_cls_names",
}


def _env_value(value: object) -> str:
    """A config value as Accelerate writes it into the environment (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def dynamo_settings(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A config file's `dynamo_config` as the launch spec carries it; None when it compiles nothing.

    Example:
        >>> dynamo_settings({"dynamo_backend": "inductor"})["backend"]
        'INDUCTOR'
        >>> dynamo_settings({"dynamo_backend": "no"}) is None
        True
    """
    known = {"dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
             "dynamo_use_regional_compilation"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"dynamo_config has unknown key(s) {', '.join(unknown)}; the keys are {', '.join(sorted(known))}.")
    backend = str(config.get("dynamo_backend") or "no").upper()
    if backend == "NO":
        return None
    # dynamic shapes left unsaid stay torch.compile's choice (no variable exported), as in Accelerate 1.16
    dynamic = config.get("dynamo_use_dynamic")
    return {"backend": backend, "mode": config.get("dynamo_mode") or "default",
            **{key: bool(config.get(f"dynamo_{key}") or False) for key in ("use_fullgraph", "use_regional_compilation")},
            "use_dynamic": None if dynamic is None else bool(dynamic)}


_FP8_KEYS = ("backend", "pad_inner_dim", "enable_fsdp_float8_all_gather", "use_autocast_during_eval", "margin",
             "interval", "format", "amax_history_len", "amax_compute_algo", "override_linear_precision", "opt_level")


def fp8_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """A config file's `fp8_config` (keys with or without ``fp8_``) as the variables Accelerate's launcher exports.

    Example:
        >>> fp8_settings({"backend": "ao", "fp8_pad_inner_dim": False})
        {'ACCELERATE_FP8_BACKEND': 'AO', 'ACCELERATE_FP8_PAD_INNER_DIM': 'False'}
    """
    out = {}
    for key, value in config.items():
        short = key.removeprefix("fp8_")
        if short not in _FP8_KEYS:
            raise ValueError(f"fp8_config has an unknown key {key!r}; the keys are {', '.join(_FP8_KEYS)}.")
        if value is None:
            continue
        if short == "override_linear_precision":  # three flags, as Accelerate exports them
            values = value.split(",") if isinstance(value, str) else list(value)
            out.update({f"ACCELERATE_FP8_OVERRIDE_{part}": str(flag).strip() for part, flag in zip(("FPROP", "DGRAD", "WGRAD"), values)})
        else:
            out[f"ACCELERATE_FP8_{short.upper()}"] = str(value).upper() if short == "backend" else str(value)
    return out


_PARALLELISM_KEYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy",
                     "sp_size", "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")


def parallelism_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """A config file's `parallelism_config` (Accelerate's ``parallelism_config_*`` keys) as the launch spec carries it.

    Example:
        >>> parallelism_settings({"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2})
        {'dp_shard_size': '2', 'tp_size': '2'}
    """
    out = {}
    for key, value in config.items():
        short = key.removeprefix("parallelism_config_")
        if short not in _PARALLELISM_KEYS:
            raise ValueError(f"parallelism_config has an unknown key {key!r}; the keys are "
                             f"{', '.join('parallelism_config_' + k for k in _PARALLELISM_KEYS)}.")
        if value is not None:
            out[short] = str(value)
    return out


class LiveSettings(NamedTuple):
    """A live run's contract (`LaunchSpec.live`): the lighthouse's address, this machine's rank, the machines a step
    needs, and the address the other machines reach this one at (its replica group's store and torchft manager)."""

    lighthouse: str
    replica: int
    min_replicas: int = 1
    address: str = "127.0.0.1"


@dataclass(frozen=True)
class LaunchSpec:
    """What `hasten launch` decided, as seen by each process.

    Example:
        >>> spec = LaunchSpec(mixed_precision="bf16", cpu=True)
        >>> LaunchSpec.from_env(spec.to_env()) == spec
        True
    """

    mixed_precision: str | None = None
    cpu: bool = False
    debug: bool = False
    gradient_accumulation_steps: int | None = None
    deepspeed: dict | None = None  # DeepSpeedConfig fields, when the run uses DeepSpeed
    fsdp: dict | None = None  # FSDPConfig fields, when the run uses FSDP
    dynamo: dict | None = None  # torch.compile settings (`dynamo_settings`), when the launch compiles
    parallelism: dict | None = None  # `parallelism_settings`: Accelerator() builds a ParallelismConfig from them
    fp8: dict | None = None  # `fp8_settings`: exported as ACCELERATE_FP8_*, which hasten.fp8's recipes read
    cpu_affinity: bool = False  # `--enable_cpu_affinity`: PartialState pins each process (`cpu_affinity_requested`)
    # Accelerate's launcher exports this for code that reads it; hasten itself does not use it.
    deepspeed_config_fields: str | None = None  # ACCELERATE_CONFIG_DS_FIELDS: DeepSpeed keys the config file gave
    # Restarts of the whole group that `hasten launch` does itself (one machine): done before this attempt, and allowed.
    restart_count: int = 0
    max_restarts: int = 0
    # `--num_machines MIN:MAX`: {"min_processes", "max_processes", "processes_per_machine"} (`elastic_sizes`); the
    # process group's timeout is not shortened (hasten.launch.peer_watch finds a lost machine from signs of life)
    elastic: dict | None = None
    # live recovery (opt-in, with `elastic`): {"lighthouse": "host:port", "replica": this machine's rank,
    # "min_replicas": machines a step needs, "address": where the others reach this machine}; survivors keep training
    # in memory (`hasten.process.live`, `live_settings`)
    live: dict | None = None

    def __post_init__(self) -> None:
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION_CHOICES)}."
            )
        if self.mixed_precision == "fp8" and (problem := fp8_problem()):
            raise ValueError(problem)

    def to_env(self) -> dict[str, str]:
        return {SPEC_ENV_VAR: json.dumps(asdict(self), sort_keys=True)}

    def elastic_sizes(self) -> ElasticSizes | None:
        """The group sizes of an elastic launch (`--num_machines MIN:MAX`); None for a fixed group.

        Example:
            >>> LaunchSpec(elastic={"min_processes": 1, "max_processes": 2, "processes_per_machine": 1}).elastic_sizes()
            ElasticSizes(min_processes=1, max_processes=2, processes_per_machine=1)
        """
        if self.elastic is None:
            return None
        from .elastic import ElasticSizes  # (loaded by elastic runs only)

        return ElasticSizes(**{key: self.elastic[key] for key in ("min_processes", "max_processes",
                                                                   "processes_per_machine") if key in self.elastic})

    def live_settings(self) -> LiveSettings | None:
        """Where this machine finds the live group (None: not a live run; a restart recovers instead).

        Example:
            >>> LaunchSpec(live={"lighthouse": "main:29510", "replica": 1}).live_settings()
            LiveSettings(lighthouse='main:29510', replica=1, min_replicas=1, address='127.0.0.1')
        """
        if not self.live:
            return None
        return LiveSettings(str(self.live["lighthouse"]), int(self.live.get("replica", 0)),
                            int(self.live.get("min_replicas", 1)), str(self.live.get("address", "127.0.0.1")))

    def peer_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables Accelerate's launcher exports, with the same meaning, derived from this spec (the one place).

        Scripts and libraries written for the peer read them (the precision,
        whether FSDP/DeepSpeed is on, the elastic restart count); hasten
        itself reads only the spec. `env` is the process's environment: the
        elastic agent's own restart count is added to this spec's, so a
        script sees ``TORCHELASTIC_RESTART_COUNT=1`` after one restart,
        whoever restarted the group.

        Example:
            >>> LaunchSpec(mixed_precision="bf16", restart_count=1).peer_env({})["TORCHELASTIC_RESTART_COUNT"]
            '1'
        """
        env = os.environ if env is None else env
        out = {
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision or "no",
            "ACCELERATE_USE_CPU": str(self.cpu),
        }
        # Accelerator() without dynamo_backend reads these (TorchDynamoPlugin), as under the peer's launcher
        dynamo = self.dynamo or {"backend": "NO", "mode": "default", "use_fullgraph": False, "use_dynamic": None,
                                 "use_regional_compilation": False}
        out.update({"ACCELERATE_DYNAMO_BACKEND": dynamo["backend"], "ACCELERATE_DYNAMO_MODE": dynamo["mode"]})
        out.update({f"ACCELERATE_DYNAMO_{key.upper()}": str(dynamo[key])
                    for key in ("use_fullgraph", "use_dynamic", "use_regional_compilation")
                    if dynamo.get(key) is not None})
        out.update(self.fp8 or {})
        if self.parallelism is not None:  # Accelerate's names; ParallelismConfig() reads them, as Accelerate's does
            out["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
            out.update({f"PARALLELISM_CONFIG_{key.upper()}": value for key, value in self.parallelism.items()})
        if self.debug:
            out["ACCELERATE_DEBUG_MODE"] = "true"
        if self.gradient_accumulation_steps is not None:
            out["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(self.gradient_accumulation_steps)
        if self.fsdp is not None:
            out["ACCELERATE_USE_FSDP"] = "true"
            out.update({name: _env_value(self.fsdp.get(key)) for name, key in _FSDP_VARIABLES.items()
                        if self.fsdp.get(key) is not None})
        if self.deepspeed is not None:
            out["ACCELERATE_USE_DEEPSPEED"] = "true"
            out.update({name: _env_value(self.deepspeed.get(key)) for name, key in _DEEPSPEED_VARIABLES.items()
                        if self.deepspeed.get(key) is not None})
            if self.deepspeed_config_fields is not None:
                out["ACCELERATE_CONFIG_DS_FIELDS"] = self.deepspeed_config_fields.lower()
        if self.cpu_affinity:
            out[PEER_CPU_AFFINITY_ENV] = "1"
        for name, ours in ((RESTART_COUNT_VAR, self.restart_count), (MAX_RESTARTS_VAR, self.max_restarts)):
            if name in env or ours:
                agent = env.get(name, "0")
                out[name] = str((int(agent) if agent.isdigit() else 0) + ours)
        return out

    @classmethod
    def current(cls) -> "LaunchSpec":
        """This process's spec, decoded once (again only if the variable changed, as between tests).

        Example:
            >>> LaunchSpec.current() is LaunchSpec.current()
            True
        """
        global _decoded
        raw = os.environ.get(SPEC_ENV_VAR)
        if _decoded is None or _decoded[0] != raw:
            _decoded = (raw, cls.from_env({SPEC_ENV_VAR: raw} if raw else {}))
        return _decoded[1]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "LaunchSpec":
        """Decode the spec from `env` (default: this process's environment); readers use `current`.

        Example:
            >>> LaunchSpec.from_env({}) == LaunchSpec()
            True
        """
        env = os.environ if env is None else env
        raw = env.get(SPEC_ENV_VAR)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{SPEC_ENV_VAR} is not valid JSON ({err}); unset it or launch with `hasten launch`.") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{SPEC_ENV_VAR} has unknown keys {unknown}: the launcher and this process run different hasten versions."
            )
        return cls(**data)


_decoded: tuple[str | None, LaunchSpec] | None = None  # (raw value, its decoding): see `LaunchSpec.current`
