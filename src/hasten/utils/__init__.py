"""The peer's ``accelerate.utils`` path (``from hasten.utils import set_seed, gather, ...``): names only.

Every name is defined once in hasten's own modules; this package and its
modules (``hasten.utils.operations``, ``.dataclasses``, ...) only re-export them.

Example:
    >>> from hasten.utils import set_seed
    >>> set_seed(0)
"""

from .operations import (
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    honor_type,
    ignorant_find_batch_size,
    is_namedtuple,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)
from .operations import CannotPadNestedTensorWarning, convert_outputs_to_fp32
from .operations import get_data_structure, initialize_tensors, is_tensor_information
from .dataclasses import TensorInformation
from .environment import are_libraries_initialized, get_cpu_distributed_information, get_current_device_type
from .dataclasses import (
    AutocastKwargs,
    ComputeEnvironment,
    CustomDtype,
    FP8BackendType,
    SageMakerDistributedType,
    DDPCommunicationHookType,
    DynamoBackend,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    RNGType,
    TorchDynamoPlugin,
)
from .dataclasses import TorchContextParallelConfig
from .environment import (
    check_cuda_fp8_capability,
    clear_environment,
    convert_dict_to_env_variables,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from .imports import *  # noqa: F401,F403 - the is_*_available probes
from .imports import get_distributed_backend, get_torch_accelerator_backend
from ..core.availability import PROBES as _probes
from .launch import (PrepareForLaunch, _filter_args, prepare_deepspeed_cmd_env, prepare_multi_gpu_env,
                     prepare_sagemager_args_inputs, prepare_simple_launcher_cmd_env, prepare_tpu)
from .memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size
from .other import (
    check_os_kernel,
    clean_state_dict_for_safetensors,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    convert_bytes,
    extract_model_from_parallel,
    get_free_port,
    get_pretty_name,
    has_compiled_regions,
    is_compiled_module,
    is_port_in_use,
    merge_dicts,
    recursive_getattr,
    wait_for_everyone,
    write_basic_config,
)
from .random import synchronize_rng_state, synchronize_rng_states
from .ao import convert_model_to_fp8_ao, filter_first_and_last_linear_layers, has_ao_layers
from .transformer_engine import apply_fp8_autowrap, contextual_fp8_autocast, convert_model, has_transformer_engine_layers
from .dataclasses import AORecipeKwargs, TERecipeKwargs
from .tqdm import tqdm
from .unavailable import *  # noqa: F401,F403 - features hasten lacks: they exist and refuse when used
from ..core.unavailable import __all__ as _unavailable
from .versions import compare_versions, is_torch_version
from ..checkpointing.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from ..big_modeling.loading import load_checkpoint_in_model
from ..checkpointing.project import ProjectConfiguration
from ..data import skip_first_batches
from ..options import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from ..checkpointing.files import save
from ..core.saving import load
from ..strategies.deepspeed.config import HfDeepSpeedConfig
from ..strategies.deepspeed.dummies import DummyOptim, DummyScheduler
from ..strategies.deepspeed.plugin import DeepSpeedPlugin
from ..strategies.deepspeed.ulysses import DeepSpeedSequenceParallelConfig
from ..strategies.deepspeed.wrappers import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper
from ..strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from ..strategies.parallel.mesh import ParallelismConfig, TorchTensorParallelConfig
from .dataclasses import TorchTensorParallelPlugin
from .other import get_model_tp_size
from .fsdp_utils import load_fsdp_model, load_fsdp_optimizer, merge_fsdp_weights, save_fsdp_model, save_fsdp_optimizer
from .modeling import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_map,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    clean_device_map,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_grad_scaler,
    get_max_layer_size,
    get_max_memory,
    get_mixed_precision_context_manager,
    has_offloaded_params,
    id_tensor_storage,
    infer_auto_device_map,
    is_peft_model,
    load_offloaded_weights,
    load_state_dict,
    named_module_tensors,
    normalize_device,
    get_accelerator_free_memory,
    retie_parameters,
    set_module_tensor_to_device,
)
from .offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from ..runtime.seeding import set_seed
from ..runtime.throughput import ThroughputMeter, count_flops_per_sample, peak_flops
from .bnb import has_4bit_bnb_layers, load_and_quantize_model
from ..big_modeling.filenames import SAFE_WEIGHTS_PATTERN_NAME, WEIGHTS_PATTERN_NAME
from .constants import PROFILE_PATTERN_NAME, TORCH_DISTRIBUTED_OPERATION_TYPES, TORCH_LAUNCH_PARAMS
from .dataclasses import BnbQuantizationConfig
from .deepspeed import get_active_deepspeed_plugin, map_pytorch_optim_to_deepspeed
from .environment import check_cuda_p2p_ib_support, get_gpu_info, set_numa_affinity
from .fsdp_utils import (disable_fsdp_ram_efficient_loading, enable_fsdp_ram_efficient_loading, ensure_weights_retied,
                         fsdp2_apply_ac, fsdp2_canonicalize_names, fsdp2_load_full_state_dict, fsdp2_prepare_model,
                         fsdp2_switch_optimizer_parameters, get_fsdp2_grad_scaler)
from .operations import GatheredParameters
from .other import get_module_children_bottom_up, model_has_dtensor

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "concatenate",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "tqdm",
    "check_cuda_fp8_capability",
    "ComputeEnvironment",
    "CustomDtype",
    "FP8BackendType",
    "SageMakerDistributedType",
    "find_batch_size",
    "find_device",
    "CannotPadNestedTensorWarning",
    "convert_outputs_to_fp32",
    "get_data_structure",
    "initialize_tensors",
    "is_tensor_information",
    "TensorInformation",
    "are_libraries_initialized",
    "get_cpu_distributed_information",
    "get_current_device_type",
    "honor_type",
    "ignorant_find_batch_size",
    "is_namedtuple",
    "is_torch_tensor",
    "listify",
    "slice_tensors",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DynamoBackend",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "RNGType",
    "TorchDynamoPlugin",
    "TorchContextParallelConfig",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
    "PrepareForLaunch",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "check_os_kernel",
    "has_compiled_regions",
    "get_free_port",
    "get_pretty_name",
    "is_compiled_module",
    "is_port_in_use",
    "merge_dicts",
    "recursive_getattr",
    "wait_for_everyone",
    "write_basic_config",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "compare_versions",
    "is_torch_version",
    *_probes,
    *_unavailable,
    "convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers",
    "apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers",
    "AORecipeKwargs", "TERecipeKwargs", "get_torch_accelerator_backend", "get_distributed_backend",
    "skip_first_batches",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradientAccumulationPlugin",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "save",
    "load",
    "set_seed",
    "ThroughputMeter",
    "count_flops_per_sample",
    "peak_flops",
    "ProjectConfiguration",
    "load_checkpoint_in_model",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
]
# The rest of Accelerate's package-level names: constants, bitsandbytes, FSDP2 / DeepSpeed helpers, host facts.
__all__ += [
    "PROFILE_PATTERN_NAME", "SAFE_WEIGHTS_PATTERN_NAME",
    "TORCH_DISTRIBUTED_OPERATION_TYPES", "TORCH_LAUNCH_PARAMS", "WEIGHTS_PATTERN_NAME",
    "BnbQuantizationConfig", "has_4bit_bnb_layers", "load_and_quantize_model",
    "get_active_deepspeed_plugin", "map_pytorch_optim_to_deepspeed", "GatheredParameters", "check_cuda_p2p_ib_support",
    "get_gpu_info", "set_numa_affinity", "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied", "fsdp2_apply_ac", "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler", "get_module_children_bottom_up",
    "model_has_dtensor",
]
# Engine plugins and helpers, and the big-model helpers (``accelerate.utils.modeling`` / ``.offload`` names).
__all__ += sorted([
    "FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "DeepSpeedSequenceParallelConfig", "DummyOptim",
    "DummyScheduler", "HfDeepSpeedConfig", "DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper",
    "ParallelismConfig", "TorchTensorParallelConfig", "TorchTensorParallelPlugin", "get_model_tp_size", "merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model",
    "save_fsdp_optimizer",
    "load_fsdp_optimizer",
    "check_device_map", "check_tied_parameters_on_same_device", "clean_device_map", "compute_module_sizes",
    "compute_module_total_buffer_size", "convert_file_size_to_int", "dtype_byte_size", "find_tied_parameters",
    "get_balanced_memory", "get_max_layer_size", "get_max_memory", "infer_auto_device_map", "load_offloaded_weights",
    "named_module_tensors", "retie_parameters", "set_module_tensor_to_device",
    "align_module_device", "calculate_maximum_sizes", "check_tied_parameters_in_config", "get_grad_scaler",
    "get_mixed_precision_context_manager", "has_offloaded_params", "clean_state_dict_for_safetensors", "id_tensor_storage", "is_peft_model",
    "load_state_dict",
    "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
    "offload_state_dict", "offload_weight", "save_offload_index",
])
