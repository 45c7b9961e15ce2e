"""The peer's ``accelerate.utils.fsdp_utils`` path: names only; the code lives in `hasten.strategies.fsdp.checkpoint`.

`save_state` / `load_state` already save and load FSDP models and optimizers;
these functions are for scripts that call the peer's helpers directly.
Every one is collective: call it on every process.

Example:
    >>> from hasten.utils.fsdp_utils import merge_fsdp_weights
    >>> merge_fsdp_weights.__name__
    'merge_fsdp_weights'
"""

from ..strategies.fsdp.checkpoint import (
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)

__all__ = ["merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer"]
