"""fp8 through NVIDIA Transformer Engine, as Accelerate 1.16 drives it (``accelerate.utils.transformer_engine``'s names).

`prepare` converts the model's `nn.Linear` / `nn.LayerNorm` layers to
``transformer_engine.pytorch``'s (`convert_model`, weights copied) and runs
its forward inside TE's ``fp8_autocast`` with a ``DelayedScaling`` recipe
built from `TERecipeKwargs` (`apply_fp8_autowrap`); in evaluation mode the
autocast is off unless ``use_autocast_during_eval=True``. TE runs on NVIDIA
GPUs only; `transformer_engine` is imported when these are called, never
before. Each function refuses in one sentence where TE is not installed.

Example:
    >>> import torch
    >>> from hasten.fp8.te import te_missing
    >>> te_missing("convert_model").startswith("convert_model needs NVIDIA Transformer Engine")
    True
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Callable

import torch
from torch import nn

from ..core.availability import is_transformer_engine_available
from .recipes import TE_MISSING

__all__ = ["convert_model", "has_transformer_engine_layers", "contextual_fp8_autocast", "apply_fp8_autowrap",
           "build_fp8_recipe", "te_missing", "TE_DEVICE_TYPES"]

TE_DEVICE_TYPES = ("cuda",)  # where TE's kernels run; `Fp8Setup` refuses TE on any other device


def te_missing(what: str) -> str:
    """The one sentence that refuses `what` where Transformer Engine is not installed.

    Example:
        >>> "pip install transformer_engine[pytorch]" in te_missing("apply_fp8_autowrap")
        True
    """
    return f"{what} {TE_MISSING}"


def _te(what: str) -> Any:
    """``transformer_engine.pytorch``, or the one-sentence refusal for `what`."""
    if not is_transformer_engine_available():
        raise ImportError(te_missing(what))
    import transformer_engine.pytorch as te

    return te


def convert_model(model: nn.Module, to_transformer_engine: bool = True, _convert_linear: bool = True,
                  _convert_ln: bool = True) -> None:
    """Swap `model`'s `nn.Linear` / `nn.LayerNorm` for Transformer Engine's, in place, copying the weights (Accelerate's rules).

    A Linear is converted when both its sizes divide by 16 (TE's fp8 matrix
    products need it); as in Accelerate, the first Linear whose sizes do
    not ends the conversion of the children of its parent that follow it
    (Accelerate returns there), so the same layers are converted as under
    Accelerate. A LayerNorm becomes ``te.LayerNorm(normalized_shape[0])``
    with its eps and weights. `to_transformer_engine=False` converts TE's
    layers back to torch's.

    Example:
        >>> import torch
        >>> from hasten.core.availability import is_transformer_engine_available
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
        >>> if is_transformer_engine_available():  # needs TE (an NVIDIA GPU); the doctest runs it only there
        ...     convert_model(model)  # model[0] is te.Linear, model[1] te.LayerNorm, with the same weights
    """
    te = _te("convert_model")
    with torch.no_grad():  # the copies into new leaf Parameters are not part of any graph
        _convert(model, te, to_transformer_engine, _convert_linear, _convert_ln)


def _convert(model: nn.Module, te: Any, to_te: bool, linear: bool, ln: bool) -> None:
    new: Any
    for name, module in model.named_children():
        if to_te and linear and isinstance(module, nn.Linear) and not isinstance(module, te.Linear):
            if any(size % 16 for size in module.weight.shape):
                return  # Accelerate's rule: stop at this parent's first Linear TE cannot run in fp8
            new = te.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                       params_dtype=module.weight.dtype)
        elif to_te and ln and isinstance(module, nn.LayerNorm) and not isinstance(module, te.LayerNorm) \
                and module.weight is not None:
            new = te.LayerNorm(module.normalized_shape[0], eps=module.eps, params_dtype=module.weight.dtype)
        elif not to_te and linear and isinstance(module, te.Linear):
            # TE keeps an empty tensor as the bias of a Linear built without one
            new = nn.Linear(module.in_features, module.out_features, dtype=module.weight.dtype,
                            bias=getattr(module, "bias", None) is not None and module.bias.numel() > 0)
        elif not to_te and ln and isinstance(module, te.LayerNorm):
            new = nn.LayerNorm(module.weight.shape[0], eps=module.eps, dtype=module.weight.dtype)
        else:
            _convert(module, te, to_te, linear, ln)
            continue
        new.weight.copy_(module.weight)
        if getattr(new, "bias", None) is not None and module.bias is not None:
            new.bias.copy_(module.bias)
        setattr(model, name, new)


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """True if `model` holds a Transformer Engine `Linear`, `LayerNorm` or `TransformerLayer`.

    Example:
        >>> import torch
        >>> from hasten.core.availability import is_transformer_engine_available
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
        >>> if is_transformer_engine_available():  # needs TE (an NVIDIA GPU); the doctest runs it only there
        ...     assert not has_transformer_engine_layers(model)
    """
    te = _te("has_transformer_engine_layers")
    kinds = tuple(kind for kind in (getattr(te, "LayerNorm", None), te.Linear, getattr(te, "TransformerLayer", None))
                  if kind is not None)
    return any(isinstance(module, kinds) for module in model.modules())


def contextual_fp8_autocast(model_forward: Callable[..., Any], fp8_recipe: Any,
                            use_during_eval: bool = False) -> Callable[..., Any]:
    """`model_forward` as a method run inside TE's ``fp8_autocast(fp8_recipe=...)``, enabled in training only unless `use_during_eval`.

    Bind the result to the model (``MethodType(forward, model)``): whether
    the autocast is enabled is read from ``model.training`` at each call.
    ``forward.__wrapped__`` is `model_forward`, so unwrapping finds it
    (``unwrap_model(model, keep_fp32_wrapper=False)`` restores it).

    Example:
        >>> import torch
        >>> from hasten.core.availability import is_transformer_engine_available
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
        >>> if is_transformer_engine_available():  # needs TE (an NVIDIA GPU); the doctest runs it only there
        ...     from transformer_engine.common.recipe import DelayedScaling
        ...     model.forward = MethodType(contextual_fp8_autocast(model.forward, DelayedScaling()), model)
    """
    _te("contextual_fp8_autocast")
    from transformer_engine.pytorch import fp8_autocast

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with fp8_autocast(enabled=use_during_eval or self.training, fp8_recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    forward.__wrapped_fp8_forward__ = model_forward  # type: ignore[attr-defined]  # what unwrap_model restores
    return forward


def build_fp8_recipe(fp8_recipe_handler: Any) -> tuple[Any, bool]:
    """TE's recipe for a `TERecipeKwargs` (None: TE's defaults) and whether autocast stays on in evaluation.

    As Accelerate: the handler's fields that differ from its defaults
    (`to_kwargs`) go to ``DelayedScaling`` (``fp8_format`` as TE's
    ``Format``), or to ``MXFP8BlockScaling`` with
    ``use_mxfp8_block_scaling=True`` where TE says the GPU supports it;
    the other fields keep TE's own defaults.

    Example:
        >>> from hasten.core.availability import is_transformer_engine_available
        >>> from hasten.utils import TERecipeKwargs
        >>> if is_transformer_engine_available():  # needs TE (an NVIDIA GPU); the doctest runs it only there
        ...     recipe, in_eval = build_fp8_recipe(TERecipeKwargs(fp8_format="E4M3"))  # DelayedScaling(Format.E4M3), False
    """
    _te("apply_fp8_autowrap")
    import transformer_engine.common.recipe as te_recipe

    kwargs = fp8_recipe_handler.to_kwargs() if fp8_recipe_handler is not None else {}
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    use_during_eval = bool(kwargs.pop("use_autocast_during_eval", False))
    if not kwargs.pop("use_mxfp8_block_scaling", False):
        return te_recipe.DelayedScaling(**kwargs), use_during_eval
    from transformer_engine.pytorch.fp8 import check_mxfp8_support

    supported, reason = check_mxfp8_support()
    if not supported:
        raise ValueError(f"use_mxfp8_block_scaling=True needs MXFP8 support, which this GPU lacks ({reason}); "
                         "drop it to train with DelayedScaling.")
    for field in ("amax_compute_algo", "amax_history_len"):
        if field in kwargs:
            raise ValueError(f"TERecipeKwargs({field}=...) does not apply to MXFP8 block scaling; drop it or "
                             "use_mxfp8_block_scaling.")
    return te_recipe.MXFP8BlockScaling(**kwargs), use_during_eval


def apply_fp8_autowrap(model: nn.Module, fp8_recipe_handler: Any) -> nn.Module:
    """Run `model`'s forward inside TE's ``fp8_autocast`` with the recipe `fp8_recipe_handler` describes; returns `model`.

    The recipe is `build_fp8_recipe`'s; in evaluation mode (``model.eval()``)
    the autocast is off unless the handler's ``use_autocast_during_eval``.

    Example:
        >>> import torch
        >>> from hasten.core.availability import is_transformer_engine_available
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
        >>> if is_transformer_engine_available():  # needs TE (an NVIDIA GPU); the doctest runs it only there
        ...     from hasten.utils import TERecipeKwargs
        ...     model = apply_fp8_autowrap(model, TERecipeKwargs(margin=1))
    """
    _te("apply_fp8_autowrap")
    recipe, use_during_eval = build_fp8_recipe(fp8_recipe_handler)
    # Always bound to the model: the wrapper reads `self.training` (Accelerate binds only a bound forward).
    model.forward = MethodType(contextual_fp8_autocast(model.forward, recipe, use_during_eval), model)
    return model
