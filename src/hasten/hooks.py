"""Forward hooks that move weights and inputs between devices, at the peer's path (``accelerate.hooks``).

The code lives in `hasten.big_modeling.hooks` (and `.casting` for `LayerwiseCastingHook`).

Example:
    >>> import torch
    >>> from hasten.hooks import ModelHook, add_hook_to_module
    >>> class Double(ModelHook):
    ...     def post_forward(self, module, output):
    ...         return output * 2
    >>> layer = add_hook_to_module(torch.nn.Identity(), Double())
    >>> layer(torch.ones(1))
    tensor([2.])
"""

from .big_modeling.casting import LayerwiseCastingHook  # noqa: F401
from .big_modeling.hooks import *  # noqa: F401,F403
from .big_modeling.hooks import __all__ as _hook_names

__all__ = [*_hook_names, "LayerwiseCastingHook"]
