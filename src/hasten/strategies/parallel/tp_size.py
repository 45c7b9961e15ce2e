"""A model's tensor-parallel degree, and the older plugin that names one (`TorchTensorParallelPlugin`).

A model split before `prepare` (transformers' ``from_pretrained(..., tp_plan="auto")``,
or `apply_tensor_parallel`) must be split over as many processes as the
``ParallelismConfig``'s ``tp_size``: `check_model_tp_size` refuses it otherwise,
as Accelerate does. Importing this module does not import torch.

Example:
    >>> class Split:
    ...     tp_size = 2
    >>> get_model_tp_size(Split()), TorchTensorParallelPlugin(tp_size=2).tp_size
    (2, 2)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.errors import ConfigError

if TYPE_CHECKING:
    from .mesh import ParallelismConfig

__all__ = ["TorchTensorParallelPlugin", "get_model_tp_size", "split_tp_size", "check_model_tp_size",
           "tp_plugin_parallelism"]


@dataclass
class TorchTensorParallelPlugin:
    """Accelerate's older tensor-parallel plugin: ``Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))``.

    Accelerate 1.16 deprecates it (a FutureWarning) and reads only `tp_size`:
    an Accelerator given it and no `parallelism_config` uses
    ``ParallelismConfig(tp_size=tp_size)``; hasten does the same.

    Args:
        tp_size: the tensor-parallel degree.
        torch_device_mesh: kept for Accelerate's field list; not read.

    Example:
        >>> TorchTensorParallelPlugin(tp_size=2)
        TorchTensorParallelPlugin(tp_size=2, torch_device_mesh=None)
    """

    tp_size: int = 1
    torch_device_mesh: Any = None


def tp_plugin_parallelism(plugin: TorchTensorParallelPlugin,
                          parallelism_config: ParallelismConfig | None) -> ParallelismConfig:
    """What ``Accelerator(torch_tp_plugin=plugin)`` trains with, as in Accelerate 1.16: a FutureWarning, then the
    `parallelism_config` given, else ``ParallelismConfig(tp_size=plugin.tp_size)``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     tp_plugin_parallelism(TorchTensorParallelPlugin(tp_size=2), None).tp_size
        2
    """
    warnings.warn("TorchTensorParallelPlugin is deprecated (as in Accelerate); pass "
                  "parallelism_config=ParallelismConfig(tp_size=...) instead.", FutureWarning, stacklevel=3)
    if parallelism_config is not None:
        return parallelism_config
    from .mesh import ParallelismConfig

    return ParallelismConfig(tp_size=plugin.tp_size)


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree a transformers model was split with (``model.tp_size``, else its config's
    ``distributed_config.tp_size``), or None when it records none.

    Example:
        >>> import torch
        >>> get_model_tp_size(torch.nn.Linear(2, 2)) is None
        True
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:  # transformers < 5 records it on the model
        return tp_size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)  # transformers >= 5
    if isinstance(distributed, dict):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)


def split_tp_size(model: Any) -> int | None:
    """How many processes `model`'s parameters are split over: what transformers recorded, else the DTensor
    parameters' "tp" mesh (or their 1-D mesh); None when no parameter is split.

    Example:
        >>> import torch
        >>> split_tp_size(torch.nn.Linear(2, 2)) is None
        True
    """
    for param in model.parameters():
        mesh = getattr(param, "device_mesh", None)
        if type(param).__name__ != "DTensor" or mesh is None:
            continue
        recorded = get_model_tp_size(model)
        if recorded is not None:
            return int(recorded)
        if "tp" in (mesh.mesh_dim_names or ()):
            return int(mesh["tp"].size())
        return int(mesh.size()) if mesh.ndim == 1 else None
    return None


def check_model_tp_size(model: Any, tp_size: int) -> None:
    """Refuse a model split before `prepare` over another number of processes than ``ParallelismConfig.tp_size``.

    Example:
        >>> import torch
        >>> check_model_tp_size(torch.nn.Linear(2, 2), 2)  # not split: prepare splits it
    """
    split = split_tp_size(model)
    if split is not None and split != tp_size:
        raise ConfigError(
            f"the model was split for tensor parallelism over {split} processes before prepare, but the "
            f"ParallelismConfig has tp_size={tp_size}; split it with tp_size={tp_size} (e.g. "
            f"from_pretrained(..., tp_plan='auto', tp_size={tp_size})) or set ParallelismConfig(tp_size={split})."
        )
