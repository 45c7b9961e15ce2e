"""Names of Accelerate features hasten does not have: they exist, so scripts import, and refuse when used.

A script that only names them in a branch it never takes (`if
accelerator.distributed_type == DistributedType.MEGATRON_LM: ...`) runs
unchanged; one that creates or calls them gets one sentence saying what is
missing and what to use instead. Each stand-in advertises Accelerate's
parameter names (its `inspect.signature`), so code that inspects them, or
passes them by keyword, sees the same API.

Example:
    >>> from hasten.core.unavailable import MegatronLMDummyScheduler
    >>> MegatronLMDummyScheduler(None)
    Traceback (most recent call last):
    ...
    NotImplementedError: MegatronLMDummyScheduler needs the Megatron-LM engine, which hasten does not have; train with DDP, FSDP or DeepSpeed instead.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

# What `accelerate.utils` itself exports of these (re-exported there by star import).
__all__ = [
    "MegatronLMPlugin", "MegatronLMDummyScheduler", "MegatronLMDummyDataLoader", "AbstractTrainStep", "GPTTrainStep",
    "BertTrainStep", "T5TrainStep", "avg_losses_across_data_parallel_group", "add_model_config_to_megatron_parser",
    "install_xla",
]
# The rest of ``accelerate.utils.megatron_lm`` and the model-config parsers of ``accelerate.utils.dataclasses``.
MEGATRON_ENGINE_NAMES = [
    "MegatronEngine", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper", "finish_mpu_init",
    "gather_across_data_parallel_groups", "initialize", "model_provider_func", "prepare_data_loader",
    "prepare_model_optimizer_scheduler", "prepare_optimizer", "prepare_scheduler", "parse_bert_config",
    "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config",
]

MEGATRON = "needs the Megatron-LM engine, which hasten does not have; train with DDP, FSDP or DeepSpeed instead."
XLA = "needs TPUs through torch_xla, which hasten does not support; run on CPUs or CUDA GPUs instead."
_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


def signature(required: tuple[str, ...], optional: dict[str, Any], method: bool = False) -> inspect.Signature:
    """The signature a stand-in advertises: `required` names, then `optional` ones with their defaults.

    Example:
        >>> str(signature(("model",), {"device_map": None}))
        '(model, device_map=None)'
    """
    names = (("self",) if method else ()) + required
    parameters = [inspect.Parameter(n, _POSITIONAL) for n in names]
    parameters += [inspect.Parameter(n, _POSITIONAL, default=d) for n, d in optional.items()]
    return inspect.Signature(parameters)


def refused_class(name: str, reason: str, module: str, *required: str, **optional: Any) -> type:
    """A class named `name` whose construction raises NotImplementedError("<name> <reason>").

    `module` is where users import it from (for its docstring's example);
    `required` / `optional` are Accelerate's parameter names for it.

    Example:
        >>> Engine = refused_class("Engine", "is not here.", __name__, "model")
        >>> Engine(None)
        Traceback (most recent call last):
        ...
        NotImplementedError: Engine is not here.
    """

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{name} {reason}")

    __init__.__signature__ = signature(required, optional, method=True)  # type: ignore[attr-defined]
    doc = (f"Not available in hasten: creating it raises NotImplementedError ({name} {reason})\n\n"
           f"Example:\n    >>> from {module} import {name}\n    >>> {name}.__name__\n    '{name}'\n")
    # Defined here (faces only re-export), whatever path the docstring shows.
    return type(name, (), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


def refused_function(name: str, reason: str, module: str, *required: str, **optional: Any) -> Callable[..., Any]:
    """A function named `name` that raises NotImplementedError("<name> <reason>") when called.

    Example:
        >>> run = refused_function("run", "is not here.", __name__, "model", steps=1)
        >>> run(None)
        Traceback (most recent call last):
        ...
        NotImplementedError: run is not here.
    """

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} {reason}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__module__ = __name__
    refuse.__signature__ = signature(required, optional)  # type: ignore[attr-defined]
    refuse.__doc__ = (f"Not available in hasten: calling it raises NotImplementedError ({name} {reason})\n\n"
                      f"Example:\n    >>> from {module} import {name}\n    >>> {name}.__name__\n    '{name}'\n")
    return refuse


# Accelerate's MegatronLMPlugin fields (every one accepted by name; the plugin itself refuses).
_MEGATRON_PLUGIN_FIELDS = (
    "tp_degree pp_degree use_custom_fsdp overlap_cpu_optimizer_d2h_h2d no_load_optim eod_mask_loss no_save_optim "
    "optimizer_cpu_offload use_precision_aware_optimizer decoder_last_pipeline_num_layers recompute_granularity "
    "recompute_method recompute_num_layers attention_backend expert_model_parallel_size context_parallel_size "
    "attention_dropout hidden_dropout attention_softmax_in_fp32 expert_tensor_parallel_size calculate_per_token_loss "
    "use_rotary_position_embeddings num_micro_batches gradient_clipping sequence_parallelism recompute_activations "
    "use_distributed_optimizer pipeline_model_parallel_split_rank num_layers_per_virtual_pipeline_stage "
    "is_train_batch_min train_iters train_samples weight_decay_incr_style start_weight_decay end_weight_decay "
    "lr_decay_style lr_decay_iters lr_decay_samples lr_warmup_iters lr_warmup_samples lr_warmup_fraction min_lr "
    "consumed_samples no_wd_decay_cond scale_lr_cond lr_mult megatron_dataset_flag seq_length encoder_seq_length "
    "decoder_seq_length tensorboard_dir set_all_logging_options eval_iters eval_interval return_logits "
    "custom_train_step_class custom_train_step_kwargs custom_model_provider_function custom_prepare_model_function "
    "custom_megatron_datasets_provider_function custom_get_batch_function custom_loss_function other_megatron_args"
).split()
_HERE = "hasten.utils.megatron_lm"

MegatronLMPlugin = refused_class("MegatronLMPlugin", MEGATRON, "hasten.utils", **dict.fromkeys(_MEGATRON_PLUGIN_FIELDS))
MegatronLMDummyScheduler = refused_class("MegatronLMDummyScheduler", MEGATRON, _HERE, "optimizer",
                                         total_num_steps=None, warmup_num_steps=0)
MegatronLMDummyDataLoader = refused_class("MegatronLMDummyDataLoader", MEGATRON, _HERE)
AbstractTrainStep = refused_class("AbstractTrainStep", MEGATRON, _HERE, "name")
GPTTrainStep = refused_class("GPTTrainStep", MEGATRON, _HERE, "accelerator", "args")
BertTrainStep = refused_class("BertTrainStep", MEGATRON, _HERE, "accelerator", "args")
T5TrainStep = refused_class("T5TrainStep", MEGATRON, _HERE, "accelerator", "args")
MegatronEngine = refused_class("MegatronEngine", MEGATRON, _HERE, "accelerator", "model", "optimizer", "scheduler")
MegatronLMOptimizerWrapper = refused_class("MegatronLMOptimizerWrapper", MEGATRON, _HERE, "optimizer")
MegatronLMSchedulerWrapper = refused_class("MegatronLMSchedulerWrapper", MEGATRON, _HERE, "scheduler", "optimizers")

avg_losses_across_data_parallel_group = refused_function("avg_losses_across_data_parallel_group", MEGATRON, _HERE,
                                                         "losses")
gather_across_data_parallel_groups = refused_function("gather_across_data_parallel_groups", MEGATRON, _HERE, "tensor")
finish_mpu_init = refused_function("finish_mpu_init", MEGATRON, _HERE)
initialize = refused_function("initialize", MEGATRON, _HERE, "accelerator", extra_args_provider=None,
                              args_defaults=None)
model_provider_func = refused_function("model_provider_func", MEGATRON, _HERE, pre_process=True, post_process=True,
                                       add_encoder=True, add_decoder=True)
prepare_data_loader = refused_function("prepare_data_loader", MEGATRON, _HERE, "accelerator", "dataloader")
prepare_model_optimizer_scheduler = refused_function("prepare_model_optimizer_scheduler", MEGATRON, _HERE,
                                                     "accelerator")
prepare_optimizer = refused_function("prepare_optimizer", MEGATRON, _HERE, "accelerator", "model")
prepare_scheduler = refused_function("prepare_scheduler", MEGATRON, _HERE, "accelerator", "optimizer", "scheduler")
# ``accelerate.utils.dataclasses``: the registry decorator for Megatron-LM model configs, and its parsers.
_CONFIGS = "hasten.utils.dataclasses"
add_model_config_to_megatron_parser = refused_function("add_model_config_to_megatron_parser", MEGATRON, _CONFIGS,
                                                       "model_type")
parse_bert_config = refused_function("parse_bert_config", MEGATRON, _CONFIGS, "megatron_lm_plugin", "model", "batch_data")
parse_gpt2_config = refused_function("parse_gpt2_config", MEGATRON, _CONFIGS, "megatron_lm_plugin", "model", "batch_data")
parse_t5_config = refused_function("parse_t5_config", MEGATRON, _CONFIGS, "megatron_lm_plugin", "model", "batch_data")
parse_llama_config = refused_function("parse_llama_config", MEGATRON, _CONFIGS, "megatron_lm_plugin", "model",
                                      "batch_data")
parse_glm4_moe_config = refused_function("parse_glm4_moe_config", MEGATRON, _CONFIGS, "megatron_lm_plugin", "model",
                                         "batch_data")

# ``accelerate.utils.torch_xla``: installing torch_xla (for Colab TPUs).
install_xla = refused_function("install_xla", XLA, "hasten.utils.torch_xla", upgrade=False)
