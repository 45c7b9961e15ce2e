"""The flags of Accelerate's `accelerate launch` (``accelerate.commands.launch.launch_command_parser``).

Accelerate's names, destinations, defaults and types, so a namespace parsed
here means what Accelerate's means (`cli/launchers.py` runs it). `hasten
launch` has its own parser, generated from hasten's config schema
(`cli/launch.py`); this one is for code and commands written for
Accelerate.

Example:
    >>> parser = CustomArgumentParser(prog="demo", add_help=False)
    >>> add_launch_arguments(parser)
    >>> args = parser.parse_args(["--multi-gpu", "--num_processes", "2", "train.py", "--lr", "1"])
    >>> args.multi_gpu, args.num_processes, args.training_script, args.training_script_args
    (True, 2, 'train.py', ['--lr', '1'])
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.environment import str_to_bool
from ..options.configuration import TORCH_DYNAMO_MODES
from .recording_parser import CustomArgumentParser

__all__ = ["add_launch_arguments", "DESCRIPTION", "DYNAMO_BACKENDS", "clean_option"]

# the compile backends Accelerate's launch flag and questionnaire offer, by its names
DYNAMO_BACKENDS = ["EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
                   "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM"]
DESCRIPTION = ("Start a Python script on one or more processes and machines, as configured by the config file and "
               "these options. Every option takes hyphens or underscores alike (`--num-processes=2` is the same "
               "option as its underscore spelling).")

_Flag = tuple[tuple[str, ...], dict[str, Any]]


def _bool(*names: str, text: str, **more: Any) -> _Flag:
    return names, {"action": "store_true", "default": False, "help": text, **more}


def _value(*names: str, kind: Any = str, default: Any = None, text: str, **more: Any) -> _Flag:
    return names, {"type": kind, "default": default, "help": text, **more}


def _fp8_override(text: str) -> tuple[bool, ...]:
    return tuple(bool(str_to_bool(part)) for part in text.split(","))


_GROUPS: list[tuple[str, str, list[_Flag]]] = [
    ("Hardware Selection Arguments", "Which hardware the processes run on.", [
        _bool("--cpu", text="run on the CPU even where accelerators are present"),
        _bool("--multi_gpu", text="start one process per GPU (torchrun)"),
        _bool("--tpu", text="a TPU run (hasten has no TPU support: refused)"),
    ]),
    ("Resource Selection Arguments", "How the chosen hardware is used.", [
        _value("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"], text="mixed precision for the run"),
        _value("--num_processes", kind=int, text="processes in total, across all machines"),
        _value("--num_machines", kind=int, text="number of machines"),
        _value("--num_cpu_threads_per_process", kind=int,
               text="OMP_NUM_THREADS of each process (default: the environment's, else 1; on CPUs a core share)"),
        _bool("--enable_cpu_affinity", text="pin each process to the CPU cores next to its GPU (nothing to pin on CPUs)"),
        _value("--dynamo_backend", choices=["no"] + [b.lower() for b in DYNAMO_BACKENDS],
               text="torch.compile backend for prepared models ('no': do not compile)"),
        _value("--dynamo_mode", default="default", choices=TORCH_DYNAMO_MODES, text="torch.compile mode"),
        _bool("--dynamo_use_fullgraph", text="compile the whole model as one graph"),
        _bool("--dynamo_use_dynamic", text="compile with dynamic shapes"),
        _bool("--dynamo_use_regional_compilation", text="compile each repeated block instead of the whole model"),
    ]),
    ("Training Paradigm Arguments", "The engine the processes train with.", [
        _bool("--use_deepspeed", text="train with DeepSpeed"),
        _bool("--use_fsdp", text="train with Fully Sharded Data Parallel"),
        _bool("--use_parallelism_config", text="build a ParallelismConfig from the parallelism options below"),
        _bool("--use_megatron_lm", text="train with Megatron-LM (hasten has no Megatron-LM engine: refused)"),
    ]),
    ("Distributed GPUs", "Where the processes and machines meet.", [
        _value("--gpu_ids", kind=None, text="GPUs of this machine to use, comma separated, or 'all'"),
        _bool("--same_network", text="all machines are on one local network"),
        _value("--machine_rank", kind=int, text="rank of this machine, from 0"),
        _value("--main_process_ip", text="address of the machine of rank 0"),
        _value("--main_process_port", kind=int, text="port of the machine of rank 0 (0: a free one)"),
        _value("-t", "--tee", default="0", text="torchrun's --tee (accepted; hasten prints every stream itself)"),
        _value("--log_dir", text="torchrun's log folder (not supported by hasten's launcher)"),
        _value("--role", default="default", text="torchrun's worker role name"),
        _value("--rdzv_backend", default="static", text="rendezvous backend: static or c10d"),
        _value("--rdzv_conf", default="", text="torchrun's extra rendezvous settings (not supported by hasten)"),
        _value("--max_restarts", kind=int, default=0, text="restarts of the whole group after a failure"),
        _value("--monitor_interval", kind=float, default=0.1, text="seconds between checks of the processes"),
    ]),
    ("TPU", "TPU runs (hasten has no TPU support: read, then refused).", [
        (("--tpu_cluster",), {"action": "store_true", "dest": "tpu_use_cluster", "help": "a TPU pod"}),
        (("--no_tpu_cluster",), {"action": "store_false", "dest": "tpu_use_cluster", "help": "a single TPU host"}),
        _bool("--tpu_use_sudo", text="run TPU pod commands with sudo"),
        (("--vm",), {"type": str, "action": "append", "help": "TPU pod workers to run on"}),
        (("--env",), {"type": str, "action": "append", "help": "variables to set on the TPU pod"}),
        _value("--main_training_function", text="the function a TPU launch calls"),
        _bool("--downcast_bf16", text="TPU bf16 downcasting"),
    ]),
    ("DeepSpeed Arguments", "DeepSpeed settings (with --use_deepspeed).", [
        _value("--deepspeed_config_file", text="a DeepSpeed JSON config file"),
        _value("--zero_stage", kind=int, text="ZeRO stage"),
        _value("--offload_optimizer_device", text="where ZeRO offloads optimizer states: none, cpu or nvme"),
        _value("--offload_param_device", text="where ZeRO-3 offloads parameters: none, cpu or nvme"),
        _value("--offload_optimizer_nvme_path", text="NVMe path for optimizer offload"),
        _value("--offload_param_nvme_path", text="NVMe path for parameter offload"),
        _value("--gradient_accumulation_steps", kind=int, text="DeepSpeed's gradient accumulation steps"),
        _value("--gradient_clipping", kind=float, text="DeepSpeed's gradient clipping"),
        _value("--zero3_init_flag", text="build large models sharded under ZeRO-3 (true/false)"),
        _value("--zero3_save_16bit_model", text="gather a 16-bit model when saving under ZeRO-3 (true/false)"),
        _value("--deepspeed_hostfile", text="DeepSpeed hostfile of the machines"),
        _value("--deepspeed_exclusion_filter", text="DeepSpeed's machine exclusion filter"),
        _value("--deepspeed_inclusion_filter", text="DeepSpeed's machine inclusion filter"),
        _value("--deepspeed_multinode_launcher", text="how DeepSpeed reaches the other machines"),
        _value("--deepspeed_moe_layer_cls_names", text="mixture-of-experts layer classes, comma separated"),
    ]),
    ("FSDP Arguments", "Fully Sharded Data Parallel settings (with --use_fsdp).", [
        _value("--fsdp_version", default="1", choices=["1", "2"], text="FSDP version (hasten always runs FSDP2)"),
        _value("--fsdp_offload_params", default="false", text="offload parameters to the CPU (true/false)"),
        _value("--fsdp_min_num_params", kind=int, default=int(1e8), text="minimum parameters of a wrapped unit"),
        _value("--fsdp_sharding_strategy", default="FULL_SHARD", text="what FSDP shards"),
        _value("--fsdp_reshard_after_forward", default="true", text="free gathered parameters after forward"),
        _value("--fsdp_auto_wrap_policy", text="which submodules become FSDP units"),
        _value("--fsdp_transformer_layer_cls_to_wrap", text="layer classes to wrap, comma separated"),
        _value("--fsdp_backward_prefetch", text="backward prefetch policy"),
        _value("--fsdp_state_dict_type", text="how checkpoints are saved"),
        _value("--fsdp_forward_prefetch", default="false", text="forward prefetch (true/false)"),
        _value("--fsdp_use_orig_params", default="true", text="keep the original parameters (true/false)"),
        _value("--fsdp_cpu_ram_efficient_loading", default="true", text="load weights on rank 0 only (true/false)"),
        _value("--fsdp_sync_module_states", default="true", text="broadcast rank 0's module states (true/false)"),
        _value("--fsdp_activation_checkpointing", default="false", text="activation checkpointing (true/false)"),
        _value("--fsdp_activation_checkpointing_offload", default="false",
               text="offload checkpointed activations to the CPU (true/false)"),
    ]),
    ("Megatron-LM Arguments", "Megatron-LM settings (hasten has no Megatron-LM engine).", [
        _value("--megatron_lm_tp_degree", kind=int, default=1, text="tensor parallel degree"),
        *[_value(f"--megatron_lm_{name}", kind=bool, default=False, text=f"Megatron-LM's {name}")
          for name in ("use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
                       "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer")],
        _value("--megatron_lm_decoder_last_pipeline_num_layers", kind=int, text="layers of the last pipeline stage"),
        _value("--megatron_lm_pp_degree", kind=int, default=1, text="pipeline parallel degree"),
        _value("--megatron_lm_num_micro_batches", kind=int, text="micro batches per step"),
        _value("--megatron_lm_sequence_parallelism", text="sequence parallelism"),
        _value("--megatron_lm_recompute_activations", text="recompute activations"),
        _value("--megatron_lm_use_distributed_optimizer", text="distributed optimizer"),
        _value("--megatron_lm_gradient_clipping", kind=float, default=1.0, text="gradient clipping"),
        *[_value(f"--megatron_lm_{name}", kind=kind, text=f"Megatron-LM's {name}")
          for name, kind in (("recompute_granularity", str), ("recompute_method", str), ("recompute_num_layers", int),
                             ("attention_backend", str), ("expert_model_parallel_size", int),
                             ("context_parallel_size", int), ("attention_dropout", float), ("hidden_dropout", float),
                             ("attention_softmax_in_fp32", str), ("expert_tensor_parallel_size", int),
                             ("calculate_per_token_loss", str), ("use_rotary_position_embeddings", str))],
    ]),
    ("FP8 Arguments", "fp8 recipe settings (with --mixed_precision fp8).", [
        _value("--fp8_backend", choices=["ao", "te", "msamp"], text="fp8 backend: torchao or Transformer Engine"),
        _bool("--fp8_use_autocast_during_eval", text="Transformer Engine: fp8 autocast in evaluation too"),
        _value("--fp8_margin", kind=int, default=0, text="Transformer Engine's scaling margin"),
        _value("--fp8_interval", kind=int, default=1, text="Transformer Engine's scaling interval"),
        _value("--fp8_format", default="HYBRID", choices=["HYBRID", "E4M3", "E5M2"], text="fp8 format"),
        _value("--fp8_amax_history_len", kind=int, default=1024, text="amax history length"),
        _value("--fp8_amax_compute_algo", default="most_recent", choices=["max", "most_recent"],
               text="how amax is computed"),
        _value("--fp8_override_linear_precision", kind=_fp8_override, default=(False, False, False),
               text="fprop,dgrad,wgrad in higher precision (three true/false words)"),
        _value("--fp8_opt_level", default="O2", choices=["O1", "O2"], text="MS-AMP level (MS-AMP is not supported)"),
        _value("--fp8_enable_fsdp_float8_all_gather", kind=str_to_bool, default="true",
               text="torchao: all-gather FSDP2 weights in fp8"),
        _value("--fp8_pad_inner_dim", kind=str_to_bool, default="true", text="torchao: pad inner dimensions to 16"),
    ]),
    ("AWS Arguments", "SageMaker credentials (hasten launches no SageMaker job).", [
        _value("--aws_access_key_id", text="AWS access key id"),
        _value("--aws_secret_access_key", text="AWS secret access key"),
    ]),
    ("MPI Arguments", "Multi-CPU runs through mpirun.", [
        _value("--mpirun_hostfile", text="hostfile of the machines mpirun starts processes on"),
    ]),
    ("ParallelismConfig Arguments", "N-D parallelism sizes (with --use_parallelism_config).", [
        _value("--parallelism_config_dp_replicate_size", kind=int, default=1, text="replicated data parallel size"),
        _value("--parallelism_config_dp_shard_size", kind=int, default=1, text="sharded data parallel size"),
        _value("--parallelism_config_tp_size", kind=int, default=1, text="tensor parallel size"),
        _value("--parallelism_config_cp_size", kind=int, default=1, text="context parallel size"),
        _value("--parallelism_config_cp_backend", default="torch", choices=["torch"], text="context parallel backend"),
        _value("--parallelism_config_cp_comm_strategy", default="allgather",
               text="context parallel exchange: allgather or alltoall"),
        _value("--parallelism_config_sp_size", kind=int, default=1, text="sequence parallel size"),
        _value("--parallelism_config_sp_backend", default="deepspeed", choices=["deepspeed"],
               text="sequence parallel backend"),
        _value("--parallelism_config_sp_seq_length", text="sequence length for sequence parallel"),
        _value("--parallelism_config_sp_seq_length_is_variable", kind=bool, default=True,
               text="whether sequence lengths vary"),
        _value("--parallelism_config_sp_attn_implementation", default="sdpa", text="attention implementation"),
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


def add_launch_arguments(parser: Any) -> None:
    """Add Accelerate's launch options, the script and its arguments to `parser` (a `CustomArgumentParser`)."""
    parser.add_argument("-h", "--help", action="help", help="show this help and exit")
    parser.add_argument("--config_file", default=None, help="config file whose values are the defaults of this launch")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="on failure, exit 1 without the launcher's own traceback")
    for title, description, flags in _GROUPS:
        group = parser.add_argument_group(title, description)
        for names, settings in flags:
            group.add_argument(*names, **settings)
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the script as a Python module (python -m)")
    parser.add_argument("--no_python", action="store_true", help="run the script as an executable, without Python")
    parser.add_argument("--debug", action="store_true", help="check collectives across processes (debug mode)")
    parser.add_argument("training_script", type=str, help="the script to run (or module, with -m)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
