"""fp8 training chosen once: which backend and recipe (`Fp8Setup.resolve`), applied to models in `prepare`.

Accelerate 1.16's choices: `mixed_precision="fp8"` without a recipe
handler picks torchao, else Transformer Engine (the first installed) with
that backend's default recipe; a recipe handler without
`mixed_precision="fp8"` is an error. Forward passes run under bf16
autocast (`hasten.runtime.precision`); torchao's `Float8Linear` (`ao.py`) or
Transformer Engine's layers inside its ``fp8_autocast`` (`te.py`) do the
fp8 matrix products. On CUDA, real fp8 needs compute capability 8.9+
(Ada, Hopper); older GPUs are refused unless the torchao recipe emulates
(``Float8LinearConfig(emulate=True)``). On the CPU, torch has an fp8
matrix product (`torch._scaled_mm`), so Accelerate's torchao recipe runs
as is; emulation, the faster one there, is the same opt-in. Transformer
Engine runs on NVIDIA GPUs only and is refused elsewhere.

Example:
    >>> import torch
    >>> setup = Fp8Setup.resolve([], "fp8", torch.device("cpu"))
    >>> setup.backend.value, type(setup.ao_recipe_handler).__name__
    ('AO', 'AORecipeKwargs')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..process.launch_spec import fp8_problem
from ..options.enums import FP8BackendType

if TYPE_CHECKING:  # the recipes (and the availability probes) are imported when fp8 is asked for (import cost)
    from .recipes import AORecipeKwargs

__all__ = ["Fp8Setup", "recipe_handlers"]


def recipe_handlers(handlers: list[Any]) -> list[Any]:
    """The fp8 recipe handlers among `handlers` (Accelerate's AORecipeKwargs / TERecipeKwargs), in order.

    Example:
        >>> recipe_handlers([])
        []
    """
    if not handlers:
        return []
    from .recipes import AORecipeKwargs, TERecipeKwargs

    return [h for h in handlers if type(h) in (AORecipeKwargs, TERecipeKwargs)]
_FP8_CAPABILITY = (8, 9)  # Ada Lovelace; Hopper is 9.0


def _plain_weights(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State dicts hold the plain tensors inside torchao's float8 all-gather weights.

    With `enable_fsdp_float8_all_gather` (the default recipe) torchao wraps each
    converted weight in a tensor subclass, on one process too; safetensors and
    checkpoint hashing cannot read its storage (Accelerate's `save_state` fails
    there). The wrapped tensor shares the weight's storage, so nothing is copied.
    """
    for key, value in state_dict.items():
        inner = getattr(value, "_tensor", None)
        if isinstance(inner, torch.Tensor) and type(value).__name__ == "WeightWithDynamicFloat8CastTensor":
            # torchao keeps the original Parameter inside: detached, as state_dict() returns, unless keep_vars
            state_dict[key] = inner if isinstance(value, nn.Parameter) else inner.detach()


def _follow_new_weights(before: dict[str, nn.Parameter], model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Point `optimizers` (param groups and any state) at the Parameters that replaced `before`'s in `model`."""
    after = dict(model.named_parameters())
    new = {id(old): after[name] for name, old in before.items() if name in after and after[name] is not old}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["params"] = [new.get(id(p), p) for p in group["params"]]
        for old in [p for p in optimizer.state if id(p) in new]:
            optimizer.state[new[id(old)]] = optimizer.state.pop(old)


@dataclass
class Fp8Setup:
    """The Accelerator's fp8 choice: enabled or not, the backend, and the recipe handlers by Accelerate's names.

    Example:
        >>> Fp8Setup.resolve([], "bf16", torch.device("cpu")).backend.value
        'NO'
    """

    enabled: bool = False
    ao_recipe_handler: AORecipeKwargs | None = None
    te_recipe_handler: Any = None

    @property
    def has_handler(self) -> bool:
        return any(h is not None for h in (self.ao_recipe_handler, self.te_recipe_handler))

    @property
    def backend(self) -> FP8BackendType:
        """Accelerate's order: torchao, then Transformer Engine."""
        if self.ao_recipe_handler is not None:
            return FP8BackendType.AO
        if self.te_recipe_handler is not None:
            return FP8BackendType.TE
        return FP8BackendType.NO

    @classmethod
    def resolve(cls, recipes: list[Any], mixed_precision: str, device: torch.device,
                deepspeed: bool = False, capability: tuple[int, int] | None = None) -> "Fp8Setup":
        """The setup for these recipe handlers and precision on `device`, refusing what cannot run in one sentence.

        `capability` is the CUDA device's (asked of torch when None);
        `deepspeed`: the run's engine is DeepSpeed, which trains fp8 on a bf16
        engine as Accelerate does (torchao's recipe without float8 all-gather,
        an FSDP2 feature; Transformer Engine's layers as elsewhere).
        """
        if mixed_precision == "fp8" and (problem := fp8_problem()):
            raise ValueError(problem)
        setup = cls(enabled=mixed_precision == "fp8")
        if not recipes and not setup.enabled:
            return setup
        from .recipes import AORecipeKwargs, TERecipeKwargs

        for recipe in recipes:
            attr = {AORecipeKwargs: "ao_recipe_handler", TERecipeKwargs: "te_recipe_handler"}[type(recipe)]
            if getattr(setup, attr) is not None:
                raise ValueError(f"kwargs_handlers got two {type(recipe).__name__} objects; pass one.")
            setattr(setup, attr, recipe)
        if setup.has_handler and not setup.enabled:
            raise ValueError(f"{type(recipes[0]).__name__} configures fp8 training; pass mixed_precision='fp8' with it.")
        if not setup.enabled:
            return setup
        if not setup.has_handler:
            setup._choose_default_backend()
        setup._check_device(device, capability)
        if deepspeed and setup.ao_recipe_handler is not None and setup.backend is FP8BackendType.AO:
            setup.ao_recipe_handler.for_deepspeed()  # float8 all-gather is FSDP2's: off by default, refused if asked
        return setup

    def _choose_default_backend(self) -> None:
        from ..core.availability import is_torchao_available, is_transformer_engine_available
        from .recipes import AORecipeKwargs, TERecipeKwargs

        # `hasten launch --fp8_backend` (or a config file's fp8_config) exports Accelerate's variable; it picks first
        chosen = os.environ.get("ACCELERATE_FP8_BACKEND", "NO").upper()
        if chosen == "AO":
            self.ao_recipe_handler = AORecipeKwargs()
        elif chosen == "TE":
            self.te_recipe_handler = TERecipeKwargs()
        elif chosen != "NO":  # MSAMP too: Accelerate 1.16 removed MS-AMP
            raise ValueError(f"ACCELERATE_FP8_BACKEND={chosen!r} is not an fp8 backend; use AO (torchao) or TE.")
        elif is_torchao_available():
            self.ao_recipe_handler = AORecipeKwargs()
        elif is_transformer_engine_available():
            self.te_recipe_handler = TERecipeKwargs()
        else:
            raise ImportError("mixed_precision='fp8' needs torchao or NVIDIA Transformer Engine and neither is installed; "
                              "install one (pip install torchao) or use mixed_precision='bf16'.")

    def _check_device(self, device: torch.device, capability: tuple[int, int] | None) -> None:
        if self.backend is FP8BackendType.TE:
            return self._check_te_device(device, capability)
        assert self.ao_recipe_handler is not None
        if device.type != "cuda" or self.ao_recipe_handler.config.emulate:
            return
        capability = capability or torch.cuda.get_device_capability(device)
        if tuple(capability) < _FP8_CAPABILITY:
            raise ValueError(
                f"mixed_precision='fp8' needs a GPU with fp8 support (compute capability 8.9 or newer: Ada, Hopper), "
                f"this one has {capability[0]}.{capability[1]}; use mixed_precision='bf16', or emulate fp8 with "
                "AORecipeKwargs(config=Float8LinearConfig(emulate=True)).")

    def _check_te_device(self, device: torch.device, capability: tuple[int, int] | None) -> None:
        from .te import TE_DEVICE_TYPES

        if device.type not in TE_DEVICE_TYPES:
            raise ValueError(f"Transformer Engine's fp8 (TERecipeKwargs) runs on NVIDIA GPUs only, and this Accelerator's "
                             f"device is {device.type}; train on a GPU, or use AORecipeKwargs (torchao), which runs here.")
        if device.type != "cuda":
            return
        capability = capability or torch.cuda.get_device_capability(device)
        if tuple(capability) < _FP8_CAPABILITY:  # TE has no emulation: its fp8 kernels need Ada or Hopper
            raise ValueError(
                f"Transformer Engine's fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper), this one has "
                f"{capability[0]}.{capability[1]}; use mixed_precision='bf16', or AORecipeKwargs with "
                "Float8LinearConfig(emulate=True).")

    def prepare(self, args: tuple[Any, ...], fsdp2: bool, strategy: Any) -> None:
        """Convert every model among `prepare`'s arguments to fp8 training, as Accelerate's prepare does.

        Transformer Engine: `_prepare_te`. torchao: with float8 all-gather (the
        default recipe) torchao replaces each converted weight by a new
        Parameter wrapping the old one; the
        optimizers of this call, and those `strategy` sets up later, are
        pointed at the new ones. (Accelerate does not: an optimizer built
        before `prepare` keeps the old Parameters, which get no gradient, so
        the fp8 layers never train.) Under FSDP2 with float8 all-gather, the
        first optimizer recomputes the float8 weight scales after each step
        (torchao's `precompute_float8_dynamic_scale_for_fsdp`), as in Accelerate.
        """
        if self.backend is FP8BackendType.TE:
            return self._prepare_te(args, strategy)
        if self.backend is not FP8BackendType.AO:
            return
        from .ao import convert_model_to_fp8_ao

        recipe = self.ao_recipe_handler
        assert recipe is not None
        models = [arg for arg in args if isinstance(arg, nn.Module)]
        optimizers = [arg for arg in args if isinstance(arg, torch.optim.Optimizer)]
        for model in models:
            before = dict(model.named_parameters())
            convert_model_to_fp8_ao(model, config=recipe.config, module_filter_func=recipe.module_filter_func)
            if recipe.config.enable_fsdp_float8_all_gather:
                model.register_state_dict_post_hook(_plain_weights)
                _follow_new_weights(before, model, optimizers)
                strategy._record_replaced_params(before, model)  # for an optimizer prepared in a later call
        if fsdp2 and models and optimizers and recipe.config.enable_fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            model = models[0]
            optimizers[0].register_step_post_hook(lambda *_: precompute_float8_dynamic_scale_for_fsdp(model))
            # Loaded weights (load_state) need their scales too, or the next forward casts with the old ones.
            model.register_load_state_dict_post_hook(lambda *_: precompute_float8_dynamic_scale_for_fsdp(model))

    def _prepare_te(self, args: tuple[Any, ...], strategy: Any) -> None:
        """Accelerate's TE preparation: the one model's layers to TE's (optimizer following), its forward in fp8_autocast.

        As in Accelerate, a `prepare` call with a model or an optimizer must
        hold exactly one of each. The forward is wrapped before the strategy
        wraps the model and puts bf16 autocast around it (Accelerate wraps
        after; both only set autocast state for the same call).
        """
        from .te import apply_fp8_autowrap, convert_model

        models = [arg for arg in args if isinstance(arg, nn.Module)]
        optimizers = [arg for arg in args if isinstance(arg, torch.optim.Optimizer)]
        if not models and not optimizers:
            return
        if len(models) != 1 or len(optimizers) != 1:
            raise ValueError(f"Transformer Engine's fp8 prepares one model with its optimizer, and prepare got "
                             f"{len(models)} model(s) and {len(optimizers)} optimizer(s); pass them together: "
                             "accelerator.prepare(model, optimizer, ...).")
        model = models[0]
        before = dict(model.named_parameters())
        convert_model(model)
        _follow_new_weights(before, model, optimizers)
        strategy._record_replaced_params(before, model)
        apply_fp8_autowrap(model, self.te_recipe_handler)
