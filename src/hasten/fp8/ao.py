"""torchao float8 conversion with Accelerate's default module filter (``accelerate.utils.ao``).

The default keeps the model's first and last `nn.Linear` in high precision
(training is unstable otherwise) and every Linear whose in/out features do
not divide by 16 (fp8 matrix products need it); every other Linear becomes
torchao's `Float8Linear`, in place.

Example:
    >>> import torch
    >>> from hasten.fp8.ao import convert_model_to_fp8_ao
    >>> model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
    >>> convert_model_to_fp8_ao(model)
    >>> [type(m).__name__ for m in model]
    ['Linear', 'Float8Linear', 'Linear']
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from torch import nn

__all__ = ["find_first_last_linear_layers", "filter_linear_layers", "filter_first_and_last_linear_layers",
           "has_ao_layers", "convert_model_to_fp8_ao"]


def find_first_last_linear_layers(model: nn.Module) -> tuple[str | None, str | None]:
    """Names of the first and last `nn.Linear` in `model.named_modules()` order (None without any).

    Example:
        >>> find_first_last_linear_layers(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
        ('0', '2')
    """
    first = last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            first = name if first is None else first
            last = name
    return first, last


def filter_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """Whether to convert `module` (named `fqn`): not a Linear with sizes indivisible by 16, not in `layers_to_filter`.

    Example:
        >>> filter_linear_layers(nn.Linear(16, 32), "body", ["head"]), filter_linear_layers(nn.Linear(8, 32), "x", [])
        (True, False)
    """
    if isinstance(module, nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str) -> bool:
    """Accelerate's filter that skips the first and last Linear found inside `module` itself.

    Example:
        >>> filter_first_and_last_linear_layers(nn.Linear(16, 16), "")
        False
    """
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: nn.Module) -> bool:
    """True if `model` holds a torchao `Float8Linear`.

    Example:
        >>> has_ao_layers(nn.Linear(16, 16))
        False
    """
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: nn.Module, config: Any = None,
                            module_filter_func: Callable[[nn.Module, str], bool] | None = None) -> None:
    """Swap `model`'s Linear layers for torchao's `Float8Linear` in place (Accelerate's default filter when none).

    `config` is a `torchao.float8.Float8LinearConfig` (torchao's default when None).

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16))
        >>> convert_model_to_fp8_ao(model, module_filter_func=lambda module, fqn: fqn == "2")
        >>> [type(m).__name__ for m in model]
        ['Linear', 'Linear', 'Float8Linear', 'Linear']
    """
    from torchao.float8 import convert_to_float8_training

    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        module_filter_func = partial(filter_linear_layers, layers_to_filter=[first, last])
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
