"""The flags of the launch command: `hasten launch` and, under the switch, `accelerate launch` (one table).

Every flag of Accelerate 1.16's `accelerate launch` is here with its name,
destination, default and type, so a namespace parsed here means what
Accelerate's means, and hasten's own flags are added to the same groups
(marked "hasten:" in their help). Each option takes hyphens or underscores
alike and is recorded in the namespace's `nondefault` set when given
(`recording_parser`): `cli/launch_settings.py` lets exactly those win over
the config file. A flag whose setting is a config-file key takes its help
text from the schema (`launch/config.py`), so each setting is described once.

Example:
    >>> parser = CustomArgumentParser(prog="demo", add_help=False)
    >>> add_launch_arguments(parser)
    >>> args = parser.parse_args(["--multi-gpu", "--num_processes", "2", "--no-cpu", "train.py", "--lr", "1"])
    >>> args.multi_gpu, args.num_processes, args.cpu, args.training_script, args.training_script_args
    (True, 2, False, 'train.py', ['--lr', '1'])
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..core.environment import str_to_bool
from ..launch.config import DeepSpeedConfig, FSDPConfig, LaunchConfig
from ..launch.live import RECOVERY_CHOICES
from ..options.configuration import TORCH_DYNAMO_MODES
from ..process.launch_spec import AS_ACCELERATE_ENV, CONFIG_FILE_ENV
from .recording_parser import CustomArgumentParser, SwitchAction, _StoreAction, _StoreConstAction, _StoreTrueAction

__all__ = ["add_launch_arguments", "launch_options", "DESCRIPTION", "DYNAMO_BACKENDS", "clean_option"]

# the compile backends Accelerate's launch flag and questionnaire offer, by its names
DYNAMO_BACKENDS = ["EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
                   "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM"]
DESCRIPTION = f"""\
Start SCRIPT (or -m MODULE) on one or more processes and machines, as the config file and these flags say.
`--num-processes=2` is `--num_processes=2`: flags take hyphens or underscores alike.

Precedence: the flags given > the config file > defaults. The config file
is --config_file, else ${CONFIG_FILE_ENV}, else hasten's default file
(`hasten config`), else Accelerate's default file. --num_processes is the
total across machines. Process start and rendezvous are torch's elastic
agent's (torchrun), or mpirun's; each process receives the settings as one
launch spec and Accelerate's ACCELERATE_* variables. Every flag of
`accelerate launch` is accepted with its meaning; TPU, SageMaker and
Megatron-LM runs are refused.
"""

_Flag = tuple[tuple[str, ...], dict[str, Any]]
_SCHEMA_HELP = {f.name: f.metadata["help"] for schema in (LaunchConfig, DeepSpeedConfig, FSDPConfig)
                for f in dataclasses.fields(schema)}


def _switch(*names: str, text: str | None = None, negatable: bool = True, default: bool | None = False) -> _Flag:
    """A yes/no flag (`default` when absent: False, as most of Accelerate's); `negatable` adds ``--no-NAME``."""
    negations = tuple(f"--no-{name[2:]}" for name in names if name.startswith("--")) if negatable else ()
    return names + negations, {"action": SwitchAction if negatable else _StoreTrueAction, "default": default,
                               "help": text}


def _value(*names: str, kind: Any = str, default: Any = None, text: str | None = None, **more: Any) -> _Flag:
    return names, {"action": _StoreAction, "type": kind, "default": default, "help": text, **more}


def _machines(text: str) -> int | str:
    """`--num_machines`: a whole number, or hasten's MIN:MAX (kept as text; the config resolution splits it)."""
    from ..process.elastic import ElasticSizeError, parse_machines

    try:
        low, high = parse_machines(text)
    except ElasticSizeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return high if ":" not in str(text) else f"{low}:{high}"


def _fp8_override(text: str) -> tuple[bool, ...]:
    return tuple(bool(str_to_bool(part)) for part in text.split(","))


_TPU = "TPU only: hasten has no TPU support (refused)"
_MEGATRON = "Megatron-LM only: hasten has no Megatron-LM engine (refused)"
_TORCHRUN = "; several processes, or a 1-process run given it, go through torchrun"

_GROUPS: list[tuple[str, str, list[_Flag]]] = [
    ("Hardware Selection Arguments", "Which hardware the processes run on.", [
        _switch("--cpu", "--use_cpu", text=_SCHEMA_HELP["use_cpu"]),
        _switch("--multi_gpu", text="one process per GPU (torchrun); the default wherever several processes run",
                negatable=False),
        _switch("--multi_cpu", text="hasten: several processes on CPUs (sets --cpu)", negatable=False),
        _switch("--tpu", text=_TPU, negatable=False),
    ]),
    ("Resource Selection Arguments", "How the chosen hardware is used.", [
        _value("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"]),
        _value("--num_processes", kind=int, text="processes in total, across all machines (default: the config "
               "file's, else one per visible GPU, at least 1)"),
        _value("--num_processes_per_machine", kind=int, metavar="N",
               text="hasten: processes on each machine (instead of the total --num_processes)"),
        _value("--num_machines", kind=_machines, metavar="[MIN:]MAX",
               text="number of machines; MIN:MAX (hasten's extension) starts an elastic run that goes on with any "
                    "number of machines in range, re-forming when one is lost or joins (docs/concepts/elastic.md)"),
        _value("--num_cpu_threads_per_process", kind=int, metavar="N",
               text="OMP_NUM_THREADS of each process (default: the environment's, else the cores divided by the "
                    "processes of this machine)"),
        _switch("--enable_cpu_affinity", text="pin each process to the CPU cores next to its GPU (NVIDIA, AMD)"),
        _value("--dynamo_backend", choices=["no"] + [b.lower() for b in DYNAMO_BACKENDS],
               text="torch.compile backend for prepared models ('no': do not compile)"),
        _value("--dynamo_mode", default="default", choices=TORCH_DYNAMO_MODES, text="torch.compile mode"),
        _switch("--dynamo_use_fullgraph", text="compile the whole model as one graph"),
        _switch("--dynamo_use_dynamic", default=None,
                text="compile with dynamic shapes (not given: torch.compile's own default, which turns to dynamic "
                     "shapes after the first recompilation)"),
        _switch("--dynamo_use_regional_compilation", text="compile each repeated block instead of the whole model"),
    ]),
    ("Training Paradigm Arguments", "The engine the processes train with.", [
        _switch("--use_deepspeed"),
        _switch("--use_fsdp"),
        _switch("--use_parallelism_config", text="build a ParallelismConfig from the parallelism options below",
                negatable=False),
        _switch("--use_megatron_lm", text=_MEGATRON, negatable=False),
        _value("--gradient_accumulation_steps", kind=int, metavar="K",
               text="gradient accumulation steps of Accelerator() (and DeepSpeed's)"),
    ]),
    ("Distributed GPUs", "Where the processes and machines meet.", [
        _value("--gpu_ids", kind=None),
        _switch("--same_network", text="all machines are on one local network (accepted as by accelerate launch: "
                "torchrun's static rendezvous is the same either way)"),
        _value("--machine_rank", kind=int),
        _value("--main_process_ip"),
        _value("--main_process_port", kind=int,
               text="rendezvous port (0: a free one; default: 29500, or a free one on one machine when it is taken)"),
        _value("--network_interface", metavar="NAME",
               text="hasten: network interface for gloo/NCCL (default: the one routing to --main_process_ip)"),
        _value("-t", "--tee", default="0", text="torchrun's --tee: also write these streams (1 out, 2 err, 3 both) "
               "to files under --log_dir, each line prefixed with its rank" + _TORCHRUN),
        _value("--log_dir", text="torchrun's log folder: each attempt's per-rank logs and error files are kept "
               "there" + _TORCHRUN),
        _value("--role", default="default", text="torchrun's worker role name" + _TORCHRUN),
        _value("--rdzv_backend", default="static", text="rendezvous backend: static or c10d"),
        _value("--rdzv_conf", default="", text="torchrun's extra rendezvous settings, key=value,..." + _TORCHRUN),
        _value("--max_restarts", kind=int, default=0, text="restart every process this many times after a failure "
               "(on one machine only after an attempt that trained a batch)"),
        _value("--elastic_recovery", default="restart", choices=list(RECOVERY_CHOICES),
               text="hasten: how an elastic run (--num_machines MIN:MAX) recovers when a machine leaves or joins: "
                    "restart (every process starts again from the newest checkpoint) or live (the others keep "
                    "training in memory and a joiner heals from a live peer; DDP or FSDP2, needs torchft; under "
                    "DeepSpeed it says so and restarts, as a ZeRO partition is held on one machine only)"),
        _value("--monitor_interval", kind=float, default=0.1, text="seconds between checks of the processes"),
        _value("--liveness_timeout", kind=float, metavar="SECONDS"),
    ]),
    ("TPU", "TPU runs (hasten has no TPU support: each of these is refused).", [
        (("--tpu_cluster",), {"action": _StoreTrueAction, "default": False, "dest": "tpu_use_cluster", "help": _TPU}),
        (("--no_tpu_cluster",), {"action": _StoreConstAction, "const": False, "default": True,
                                 "dest": "tpu_use_cluster", "help": _TPU}),
        _switch("--tpu_use_sudo", text=_TPU, negatable=False),
        (("--vm",), {"type": str, "action": "append", "help": _TPU}),
        (("--env",), {"type": str, "action": "append", "help": _TPU}),
        _value("--main_training_function", text=_TPU),
        _switch("--downcast_bf16", text=_TPU, negatable=False),
    ]),
    ("DeepSpeed Arguments", "DeepSpeed settings (with --use_deepspeed).", [
        _value("--deepspeed_config_file"),
        _value("--zero_stage", kind=int),
        _value("--offload_optimizer_device"),
        _value("--offload_param_device"),
        _value("--offload_optimizer_nvme_path"),
        _value("--offload_param_nvme_path"),
        _value("--gradient_clipping", kind=float),
        _value("--zero3_init_flag", text=_SCHEMA_HELP["zero3_init_flag"] + " (true/false)"),
        _value("--zero3_save_16bit_model", text=_SCHEMA_HELP["zero3_save_16bit_model"] + " (true/false)"),
        _value("--deepspeed_hostfile"),
        _value("--deepspeed_exclusion_filter"),
        _value("--deepspeed_inclusion_filter"),
        _value("--deepspeed_multinode_launcher", text="how DeepSpeed reaches the other machines: pdsh (default), "
               "standard (torchrun on each machine), openmpi, mvapich, mpich, nossh, slurm"),
        _value("--deepspeed_moe_layer_cls_names"),
    ]),
    ("FSDP Arguments", "Fully Sharded Data Parallel settings (with --use_fsdp; hasten always runs FSDP2).", [
        _value("--fsdp_version", choices=["1", "2"], text="FSDP version (default 2; 1 runs on FSDP2 with a notice)"),
        _value("--fsdp_offload_params", default="false", text=_SCHEMA_HELP["fsdp_offload_params"] + " (true/false)"),
        _value("--fsdp_min_num_params", kind=int, default=int(1e8)),
        _value("--fsdp_sharding_strategy", default="FULL_SHARD"),
        _value("--fsdp_reshard_after_forward", default="true",
               text=_SCHEMA_HELP["fsdp_reshard_after_forward"] + " (true/false)"),
        _value("--fsdp_auto_wrap_policy"),
        _value("--fsdp_transformer_layer_cls_to_wrap"),
        _value("--fsdp_backward_prefetch"),
        _value("--fsdp_state_dict_type"),
        _value("--fsdp_forward_prefetch", default="false", text=_SCHEMA_HELP["fsdp_forward_prefetch"] + " (true/false)"),
        _value("--fsdp_use_orig_params", default="true", text=_SCHEMA_HELP["fsdp_use_orig_params"] + " (true/false)"),
        _value("--fsdp_cpu_ram_efficient_loading", default="true",
               text=_SCHEMA_HELP["fsdp_cpu_ram_efficient_loading"] + " (true/false)"),
        _value("--fsdp_sync_module_states", default="true",
               text=_SCHEMA_HELP["fsdp_sync_module_states"] + " (true/false)"),
        _value("--fsdp_activation_checkpointing", default="false",
               text=_SCHEMA_HELP["fsdp_activation_checkpointing"] + " (true/false)"),
        _value("--fsdp_activation_checkpointing_offload", default="false",
               text=_SCHEMA_HELP["fsdp_activation_checkpointing_offload"] + " (true/false)"),
    ]),
    ("Megatron-LM Arguments", "Megatron-LM settings (hasten has no Megatron-LM engine: each is refused).", [
        _value("--megatron_lm_tp_degree", kind=int, default=1, text=_MEGATRON),
        *[_value(f"--megatron_lm_{name}", kind=bool, default=False, text=_MEGATRON)
          for name in ("use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
                       "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer")],
        _value("--megatron_lm_decoder_last_pipeline_num_layers", kind=int, text=_MEGATRON),
        _value("--megatron_lm_pp_degree", kind=int, default=1, text=_MEGATRON),
        _value("--megatron_lm_num_micro_batches", kind=int, text=_MEGATRON),
        *[_value(f"--megatron_lm_{name}", text=_MEGATRON)
          for name in ("sequence_parallelism", "recompute_activations", "use_distributed_optimizer")],
        _value("--megatron_lm_gradient_clipping", kind=float, default=1.0, text=_MEGATRON),
        *[_value(f"--megatron_lm_{name}", kind=kind, text=_MEGATRON)
          for name, kind in (("recompute_granularity", str), ("recompute_method", str), ("recompute_num_layers", int),
                             ("attention_backend", str), ("expert_model_parallel_size", int),
                             ("context_parallel_size", int), ("attention_dropout", float), ("hidden_dropout", float),
                             ("attention_softmax_in_fp32", str), ("expert_tensor_parallel_size", int),
                             ("calculate_per_token_loss", str), ("use_rotary_position_embeddings", str))],
    ]),
    ("FP8 Arguments", "fp8 recipe settings (with --mixed_precision fp8; read by Accelerator() as ACCELERATE_FP8_*).", [
        _value("--fp8_backend", type=str.lower, choices=["ao", "te"], text="fp8 backend: torchao or Transformer Engine"),
        _switch("--fp8_use_autocast_during_eval", text="Transformer Engine: fp8 autocast in evaluation too",
                negatable=False),
        _value("--fp8_margin", kind=int, default=0, text="Transformer Engine's scaling margin"),
        _value("--fp8_interval", kind=int, default=1, text="Transformer Engine's scaling interval"),
        _value("--fp8_format", default="HYBRID", choices=["HYBRID", "E4M3", "E5M2"], text="fp8 format"),
        _value("--fp8_amax_history_len", kind=int, default=1024, text="amax history length"),
        _value("--fp8_amax_compute_algo", default="most_recent", choices=["max", "most_recent"],
               text="how amax is computed"),
        _value("--fp8_override_linear_precision", kind=_fp8_override, default=(False, False, False),
               text="fprop,dgrad,wgrad in higher precision (three true/false words)"),
        _value("--fp8_enable_fsdp_float8_all_gather", kind=str_to_bool, default="true",
               text="torchao: all-gather FSDP2 weights in fp8"),
        _value("--fp8_pad_inner_dim", kind=str_to_bool, default="true", text="torchao: pad inner dimensions to 16"),
    ]),
    ("AWS Arguments", "SageMaker credentials (hasten launches no SageMaker job: each is refused).", [
        _value("--aws_access_key_id", text="SageMaker only (refused)"),
        _value("--aws_secret_access_key", text="SageMaker only (refused)"),
    ]),
    ("MPI Arguments", "Multi-CPU runs through mpirun (Open MPI).", [
        _value("--mpirun_hostfile", text="hostfile of the machines mpirun starts processes on (implies --mpirun)"),
        _switch("--mpirun", text="hasten: start the processes with Open MPI's mpirun instead of torchrun "
                "(plain multi-CPU runs)"),
    ]),
    ("ParallelismConfig Arguments", "N-D parallelism sizes: Accelerator() builds a ParallelismConfig from them.", [
        _value("--parallelism_config_dp_replicate_size", kind=int, default=1, text="replicated data parallel size"),
        _value("--parallelism_config_dp_shard_size", kind=int, default=1, text="sharded data parallel size"),
        _value("--parallelism_config_tp_size", kind=int, default=1, text="tensor parallel size"),
        _value("--parallelism_config_cp_size", kind=int, default=1, text="context parallel size"),
        _value("--parallelism_config_cp_backend", default="torch", choices=["torch"], text="context parallel backend"),
        _value("--parallelism_config_cp_comm_strategy", default="allgather", choices=["allgather", "alltoall"],
               text="context parallel exchange"),
        _value("--parallelism_config_sp_size", kind=int, default=1, text="sequence parallel size"),
        _value("--parallelism_config_sp_backend", default="deepspeed", choices=["deepspeed"],
               text="sequence parallel backend"),
        _value("--parallelism_config_sp_seq_length", text="sequence length for sequence parallel"),
        _value("--parallelism_config_sp_seq_length_is_variable", kind=bool, default=True,
               text="whether sequence lengths vary"),
        _value("--parallelism_config_sp_attn_implementation", default="sdpa", text="attention implementation"),
    ]),
    ("hasten", "What hasten's launcher adds.", [
        _switch("--dry_run", text="print the command and launch spec, start nothing", negatable=False),
        _switch("--as_accelerate", text="every `import accelerate` in the processes gets hasten (transformers' "
                f"Trainer, TRL, PEFT, diffusers run on hasten unchanged); also on with {AS_ACCELERATE_ENV}=1; "
                "always on for `accelerate launch`", negatable=False),
    ]),
]


def clean_option(option: str) -> str | None:
    """A long option as a destination name (`--num-processes` -> `num_processes`); None for short ones.

    Example:
        >>> clean_option("--num-processes"), clean_option("-q")
        ('num_processes', None)
    """
    if "fp8_backend" in option:
        option = "--fp8_backend"
    return option[2:].replace("-", "_") if option.startswith("--") else None


def launch_options() -> list[str]:
    """Every long option of the launch command, in its underscore spelling, as `--help` lists them.

    Example:
        >>> {"--tee", "--liveness_timeout", "--no_python"} <= set(launch_options())
        True
    """
    parser = CustomArgumentParser(prog="launch", add_help=False)
    add_launch_arguments(parser)
    return [name for action in parser._actions for name in action.option_strings
            if name.startswith("--") and "-" not in name[2:]]


def add_launch_arguments(parser: Any) -> None:
    """Add every launch flag, the script and its arguments to `parser` (any `argparse.ArgumentParser`).

    The actions record what was given (`nondefault`) in any parser, so
    `hasten launch` (a `ConciseParser`) and `accelerate launch` (a
    `CustomArgumentParser`) parse alike.
    """
    parser.add_argument("-h", "--help", action="help", help="show this help and exit")
    parser.add_argument("--config_file", action=_StoreAction, default=None, metavar="PATH",
                        help="config file whose values are the defaults of this launch (hasten's or Accelerate's)")
    parser.add_argument("-q", "--quiet", action=_StoreTrueAction, default=None,
                        help="no notes, only the script's output and errors; `accelerate launch` exits 1 on a "
                             "failure instead of raising CalledProcessError")
    for title, description, flags in _GROUPS:
        group = parser.add_argument_group(title, description)
        for names, settings in flags:
            if settings.get("help") is None:
                settings = {**settings, "help": _SCHEMA_HELP[clean_option(names[0]) or ""]}
            group.add_argument(*names, **settings)
    parser.add_argument("-m", "--module", action=_StoreTrueAction, default=None,
                        help="run SCRIPT as a Python module (python -m)")
    parser.add_argument("--no_python", action=_StoreTrueAction, default=None,
                        help="run SCRIPT as an executable, without Python (without hasten's worker around it)")
    parser.add_argument(*_switch("--debug")[0], action=SwitchAction, default=None, help=_SCHEMA_HELP["debug"])
    parser.add_argument("training_script", action=_StoreAction, metavar="SCRIPT",
                        help="the training script (or module, with -m)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's own arguments")
