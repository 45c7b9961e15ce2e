"""Accelerate's FSDP checkpoint helpers (``accelerate.utils.fsdp_utils``), for scripts that call them directly.

`save_state` / `load_state` already save and load FSDP models and
optimizers (`checkpoint.py`); these write and read the same layout: one
full file from the main process, a DCP directory per model and optimizer
(the state under ``"model"`` / ``"optimizer"``, as Accelerate writes it),
or with ``use_dcp=False`` one file per process. Every one is collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from .checkpoint import (MODEL_DIR, MODEL_KEY, OPTIMIZER_DIR, OPTIMIZER_KEY, _dcp_load, _options,
                         full_optimizer_state_dict, load_full_optimizer_state_dict, optimizer_state)
from .plugin import FullyShardedDataParallelPlugin

__all__ = ["Processes", "save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer"]


class Processes(Protocol):
    """What the peer's FSDP helpers ask of the `accelerator` they are given: who writes, and a barrier.

    Example:
        >>> class One:
        ...     is_main_process, process_index = True, 0
        ...     def wait_for_everyone(self): pass
        >>> processes: Processes = One()
    """

    @property
    def is_main_process(self) -> bool: ...

    @property
    def process_index(self) -> int: ...

    def wait_for_everyone(self) -> None: ...


def _name(base: str, index: int, suffix: str = "") -> str:
    return f"{base}{suffix}" if index == 0 else f"{base}_{index}{suffix}"


def _is_full(fsdp_plugin: FullyShardedDataParallelPlugin) -> bool:
    return fsdp_plugin.state_dict_name == "FULL_STATE_DICT"


def _per_rank(directory: Path, base: str, index: int, processes: Processes) -> Path:
    """Accelerate's per-process file (``use_dcp=False``): each process writes and reads only its own shard."""
    return directory / f"{base}_{index}_rank{processes.process_index}.bin"


def _adapter_only(model: nn.Module, adapter_only: bool) -> bool:
    """Accelerate's meaning of ``adapter_only``: only a PEFT model's trainable (adapter) weights; other models in full."""
    inner = getattr(model, "module", model)
    return adapter_only and any(hasattr(m, "peft_config") for m in (model, inner))


def save_fsdp_model(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Processes, model: nn.Module,
                    output_dir: str | Path, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True) -> None:
    """Save an FSDP model: one full file from the main process, or a sharded DCP directory written by every process.

    With `use_dcp=False` a sharded save is one file per process instead
    (``pytorch_model_fsdp_<index>_rank<process>.bin``, no cross-process
    planning; load it with `use_dcp=False` on the same number of processes).

    Example:
        >>> from hasten import PartialState  # in a run: accelerator.state.fsdp_plugin, accelerator
        >>> plugin, processes = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"), PartialState(cpu=True)
        >>> save_fsdp_model(plugin, processes, nn.Linear(4, 2), "out")
        >>> sorted(path.name for path in Path("out").iterdir())
        ['pytorch_model_fsdp_0']
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    trainable_only = _adapter_only(model, adapter_only)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _is_full(fsdp_plugin):
        offload = getattr(fsdp_plugin.state_dict_config, "offload_to_cpu", True)
        state = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=offload,
                                                             ignore_frozen_params=trainable_only))
        if accelerator.is_main_process:
            torch.save(state, output_dir / _name(MODEL_DIR, model_index, ".bin"))
    elif not use_dcp:
        torch.save(get_model_state_dict(model, options=_options(ignore_frozen_params=trainable_only)),
                   _per_rank(output_dir, MODEL_DIR, model_index, accelerator))
    else:
        dcp.save({MODEL_KEY: get_model_state_dict(model, options=_options(ignore_frozen_params=trainable_only))},
                 checkpoint_id=output_dir / f"{MODEL_DIR}_{model_index}")
    accelerator.wait_for_everyone()


def load_fsdp_model(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Processes, model: nn.Module,
                    input_dir: str | Path, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True) -> None:
    """Load what `save_fsdp_model` wrote (with the same `use_dcp`) into the prepared (sharded) model.

    Example:
        >>> from hasten import PartialState  # in a run: accelerator.state.fsdp_plugin, accelerator
        >>> plugin, processes = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"), PartialState(cpu=True)
        >>> model, copy = nn.Linear(4, 2), nn.Linear(4, 2)
        >>> save_fsdp_model(plugin, processes, model, "out")
        >>> load_fsdp_model(plugin, processes, copy, "out")
        >>> torch.equal(copy.weight, model.weight)
        True
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    trainable_only = _adapter_only(model, adapter_only)
    input_dir = Path(input_dir)
    if _is_full(fsdp_plugin):
        saved = torch.load(input_dir / _name(MODEL_DIR, model_index, ".bin"), weights_only=True)
        set_model_state_dict(model, saved, options=_options(full_state_dict=True, strict=not trainable_only))
    elif not use_dcp:
        saved = torch.load(_per_rank(input_dir, MODEL_DIR, model_index, accelerator), weights_only=True)
        set_model_state_dict(model, saved, options=_options(strict=not trainable_only))
    else:
        state = _dcp_load(get_model_state_dict(model, options=_options(ignore_frozen_params=trainable_only)),
                          input_dir / f"{MODEL_DIR}_{model_index}", MODEL_KEY)
        set_model_state_dict(model, state, options=_options(strict=not trainable_only))


def save_fsdp_optimizer(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Processes,
                        optimizer: torch.optim.Optimizer, model: nn.Module, output_dir: str | Path,
                        optimizer_index: int = 0, use_dcp: bool = True) -> None:
    """Save an FSDP optimizer's state, full (main process) or sharded (every process; one file each with `use_dcp=False`).

    Example:
        >>> from hasten import PartialState  # in a run: accelerator.state.fsdp_plugin, accelerator
        >>> plugin, processes = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"), PartialState(cpu=True)
        >>> model = nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> save_fsdp_optimizer(plugin, processes, optimizer, model, "out")
        >>> sorted(path.name for path in Path("out").iterdir())
        ['optimizer_0']
    """
    import torch.distributed.checkpoint as dcp

    inner = getattr(optimizer, "optimizer", optimizer)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _is_full(fsdp_plugin):
        state = full_optimizer_state_dict(model, inner)
        if accelerator.is_main_process:
            torch.save(state, output_dir / _name(OPTIMIZER_DIR, optimizer_index, ".bin"))
    elif not use_dcp:
        torch.save(optimizer_state(model, inner), _per_rank(output_dir, OPTIMIZER_DIR, optimizer_index, accelerator))
    else:
        dcp.save({OPTIMIZER_KEY: optimizer_state(model, inner)},
                 checkpoint_id=output_dir / f"{OPTIMIZER_DIR}_{optimizer_index}")
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Processes,
                        optimizer: torch.optim.Optimizer, model: nn.Module, input_dir: str | Path,
                        optimizer_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> None:
    """Load what `save_fsdp_optimizer` wrote (with the same `use_dcp`) into the prepared optimizer.

    Example:
        >>> from hasten import PartialState  # in a run: accelerator.state.fsdp_plugin, accelerator
        >>> plugin, processes = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT"), PartialState(cpu=True)
        >>> model = nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> save_fsdp_optimizer(plugin, processes, optimizer, model, "out")
        >>> load_fsdp_optimizer(plugin, processes, optimizer, model, "out")
        >>> optimizer.param_groups[0]["lr"]
        0.1
    """
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    inner = getattr(optimizer, "optimizer", optimizer)
    input_dir = Path(input_dir)
    if _is_full(fsdp_plugin):
        saved = torch.load(input_dir / _name(OPTIMIZER_DIR, optimizer_index, ".bin"), weights_only=True)
        load_full_optimizer_state_dict(model, inner, saved)
    elif not use_dcp:
        saved = torch.load(_per_rank(input_dir, OPTIMIZER_DIR, optimizer_index, accelerator), weights_only=True)
        set_optimizer_state_dict(model, inner, saved)
    else:
        state = _dcp_load(optimizer_state(model, inner), input_dir / f"{OPTIMIZER_DIR}_{optimizer_index}", OPTIMIZER_KEY)
        set_optimizer_state_dict(model, inner, state)
