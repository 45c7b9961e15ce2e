"""FSDP helpers under the peer's import path (``accelerate.utils.fsdp_utils``), on hasten's FSDP2 strategy.

`save_state` / `load_state` already save and load FSDP models and optimizers;
these functions are for scripts that call the peer's helpers directly.
Every one is collective: call it on every process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..strategies.fsdp_checkpoint import (
    MODEL_DIR,
    OPTIMIZER_DIR,
    full_model_state_dict,
    full_optimizer_state_dict,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
    merge_fsdp_weights,
    optimizer_state,
)

__all__ = ["merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer"]


def _name(base: str, index: int, suffix: str = "") -> str:
    return f"{base}{suffix}" if index == 0 else f"{base}_{index}{suffix}"


def _is_full(fsdp_plugin: Any) -> bool:
    return fsdp_plugin.state_dict_type == "FULL_STATE_DICT"


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, output_dir: str | Path, model_index: int = 0,
                    adapter_only: bool = False) -> None:
    """Save an FSDP model: one full file from the main process, or a sharded DCP directory written by every process.

    Example:
        >>> save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, "out")  # doctest: +SKIP
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if adapter_only:
        raise NotImplementedError("adapter_only=True needs PEFT integration, which hasten does not have; save the whole model.")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _is_full(fsdp_plugin):
        state = full_model_state_dict(model)
        if accelerator.is_main_process:
            torch.save(state, output_dir / _name(MODEL_DIR, model_index, ".bin"))
    else:
        dcp.save(get_model_state_dict(model), checkpoint_id=output_dir / f"{MODEL_DIR}_{model_index}")
    accelerator.wait_for_everyone()


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, input_dir: str | Path, model_index: int = 0,
                    adapter_only: bool = False) -> None:
    """Load what `save_fsdp_model` wrote into the prepared (sharded) model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    if adapter_only:
        raise NotImplementedError("adapter_only=True needs PEFT integration, which hasten does not have; load the whole model.")
    input_dir = Path(input_dir)
    if _is_full(fsdp_plugin):
        load_full_model_state_dict(model, torch.load(input_dir / _name(MODEL_DIR, model_index, ".bin"), weights_only=True))
    else:
        state = get_model_state_dict(model)
        dcp.load(state, checkpoint_id=input_dir / f"{MODEL_DIR}_{model_index}")
        set_model_state_dict(model, state)


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any, output_dir: str | Path,
                        optimizer_index: int = 0) -> None:
    """Save an FSDP optimizer's state, full (main process) or sharded (every process)."""
    import torch.distributed.checkpoint as dcp

    inner = getattr(optimizer, "optimizer", optimizer)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _is_full(fsdp_plugin):
        state = full_optimizer_state_dict(model, inner)
        if accelerator.is_main_process:
            torch.save(state, output_dir / _name(OPTIMIZER_DIR, optimizer_index, ".bin"))
    else:
        dcp.save(optimizer_state(model, inner), checkpoint_id=output_dir / f"{OPTIMIZER_DIR}_{optimizer_index}")
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any, input_dir: str | Path,
                        optimizer_index: int = 0, adapter_only: bool = False) -> None:
    """Load what `save_fsdp_optimizer` wrote into the prepared optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    inner = getattr(optimizer, "optimizer", optimizer)
    input_dir = Path(input_dir)
    if _is_full(fsdp_plugin):
        saved = torch.load(input_dir / _name(OPTIMIZER_DIR, optimizer_index, ".bin"), weights_only=True)
        load_full_optimizer_state_dict(model, inner, saved)
    else:
        state = optimizer_state(model, inner)
        dcp.load(state, checkpoint_id=input_dir / f"{OPTIMIZER_DIR}_{optimizer_index}")
        set_optimizer_state_dict(model, inner, state)
