"""The peer's ``accelerate.utils.fsdp_utils`` path: names only; the code lives in `hasten.strategies.fsdp`
(`checkpoint` for saving and loading, `helpers` for Accelerate's FSDP2 helper functions).

`prepare`, `save_state` and `load_state` already do all of this; these
functions are for scripts that call the peer's helpers directly. The ones
that move tensors between processes are collective: call them on every process.

Example:
    >>> from hasten.utils.fsdp_utils import fsdp2_canonicalize_names
    >>> fsdp2_canonicalize_names({"_orig_mod.fc.weight": 0})
    {'fc.weight': 0}
"""

from ..runtime.modules import get_module_children_bottom_up, get_module_class_from_name
from ..strategies.fsdp.checkpoint import merge_fsdp_weights
from ..strategies.fsdp.checkpoint_functions import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
from ..strategies.fsdp.helpers import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_auto_wrap_policy,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    get_parameters_from_modules,
)

__all__ = ["merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer",
           "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading", "ensure_weights_retied",
           "fsdp2_apply_ac", "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict", "fsdp2_prepare_auto_wrap_policy",
           "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler",
           "get_parameters_from_modules", "get_module_children_bottom_up", "get_module_class_from_name"]
