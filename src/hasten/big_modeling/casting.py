"""Layerwise casting: weights stored in a small dtype, cast up just for the forward of the layer that uses them.

Only one layer's weights exist in the compute dtype at a time, so a model
stored in bfloat16 (or float8 where torch has it) runs in float32 or
bfloat16 with the memory of its storage dtype plus one layer. Storage to
compute and back is exact (the compute dtype is wider), so the stored
weights never drift; the loss of precision happens once, when they are
first cast down. Meant for inference: a gradient would reach the
temporary compute-dtype weights, not the stored ones.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import nn

from .hooks import ModelHook, add_hook_to_module

__all__ = ["LayerwiseCastingHook", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING", "attach_layerwise_casting_hooks"]

_log = logging.getLogger(__name__)

# Layers whose weights only feed a matmul or convolution; norms and embeddings keep their dtype (low precision
# statistics hurt far more than low precision matmul weights).
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
)


def _check_floating(label: str, dtype: Any) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{label}={dtype!r} is not a floating-point torch dtype; use one such as torch.bfloat16, "
                         "torch.float16, torch.float32 (or a torch.float8_* type for storage).")


class LayerwiseCastingHook(ModelHook):
    """Keep a module's floating-point tensors in `storage_dtype`, in `compute_dtype` only while it runs.

    Attaching it casts the module down; each forward casts it up first and
    down again after. `non_blocking` makes those casts asynchronous where
    torch can. Integer and bool tensors are left alone.

    Example:
        >>> layer = add_hook_to_module(nn.Linear(2, 2), LayerwiseCastingHook(torch.bfloat16, torch.float32, False))
        >>> layer(torch.ones(2)).dtype, layer.weight.dtype
        (torch.float32, torch.bfloat16)
    """

    _is_stateful = False  # the peer's marker: this hook keeps no state between calls

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        _check_floating("storage_dtype", storage_dtype)
        _check_floating("compute_dtype", compute_dtype)
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def __repr__(self) -> str:
        return (f"LayerwiseCastingHook(storage_dtype={self.storage_dtype}, compute_dtype={self.compute_dtype}, "
                f"non_blocking={self.non_blocking})")

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    # torch.compile must not trace the casts: they swap the module's tensors, a side effect outside the graph.
    @torch.compiler.disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @torch.compiler.disable
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | tuple[str, ...] | list[str] | None = None,
                                   skip_modules_classes: type[nn.Module] | tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False) -> None:
    """Store the weights of every Linear/Conv layer of `module` in `storage_dtype`; each runs in `compute_dtype`.

    Layers are found top-down; a module whose dotted name matches one of the
    regular expressions `skip_modules_pattern` (``re.search``), or that is an
    instance of `skip_modules_classes`, is left as it is, with everything
    under it. Other layers (norms, embeddings) keep their dtype. Each hook is
    appended after hooks already there (an offloading hook loads the weights
    first, then they are cast).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
        >>> attach_layerwise_casting_hooks(net, torch.bfloat16, torch.float32, skip_modules_pattern=r"^2$")
        >>> [p.dtype for p in (net[0].weight, net[1].weight, net[2].weight)]
        [torch.bfloat16, torch.float32, torch.float32]
        >>> net(torch.ones(1, 4)).dtype
        torch.float32
    """
    _check_floating("storage_dtype", storage_dtype)
    _check_floating("compute_dtype", compute_dtype)
    # one string is one pattern (iterating it would test each character as a pattern)
    patterns = [skip_modules_pattern] if isinstance(skip_modules_pattern, str) else list(skip_modules_pattern or ())
    skip_classes = skip_modules_classes if skip_modules_classes is not None else ()
    pending = [("", module)]
    while pending:
        name, current = pending.pop(0)
        if isinstance(current, skip_classes) or any(re.search(pattern, name) for pattern in patterns):
            _log.debug("layerwise casting skips %r", name)
            continue
        if isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(current, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
            continue
        pending[:0] = [(f"{name}.{child}" if name else child, sub) for child, sub in current.named_children()]
