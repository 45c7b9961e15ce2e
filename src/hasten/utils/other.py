"""The peer's ``accelerate.utils.other`` path: names only; the code lives in hasten's own modules.

Example:
    >>> import torch
    >>> from hasten.utils.other import extract_model_from_parallel
    >>> net = torch.nn.Linear(2, 2)
    >>> extract_model_from_parallel(net) is net
    True
"""

from ..big_modeling.model_helpers import clean_state_dict_for_safetensors
from ..cli.basic_config import write_basic_config
from ..core.objects import convert_bytes, get_pretty_name, merge_dicts, recursive_getattr
from ..runtime.operations import wait_for_everyone
from ..process.ports import get_free_port, is_port_in_use
from ..runtime.regional import (compile_regions, compile_regions_deepspeed, compile_regions_fsdp2, has_compiled_regions,
                        has_repeated_blocks, is_repeated_blocks)
from ..checkpointing.files import save
from ..core.saving import load
from ..strategies.parallel.tp_size import get_model_tp_size
from ..runtime.unwrap import extract_model_from_parallel, is_compiled_module
from ..runtime.host import check_os_kernel
from ..runtime.modules import get_module_children_bottom_up, model_has_dtensor
from ..core.availability import is_torch_distributed_available

__all__ = [
    "check_os_kernel", "clean_state_dict_for_safetensors", "compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2", "convert_bytes",
    "extract_model_from_parallel", "has_compiled_regions", "has_repeated_blocks", "is_repeated_blocks", "get_free_port", "get_model_tp_size", "get_pretty_name", "is_compiled_module",
    "is_port_in_use", "load", "merge_dicts", "recursive_getattr", "save", "wait_for_everyone", "write_basic_config",
    "get_module_children_bottom_up", "model_has_dtensor", "is_torch_distributed_available",
]
