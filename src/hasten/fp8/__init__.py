"""fp8 training: Accelerate's recipe handlers, torchao's float8 conversion, Transformer Engine's, the one-time choice.

- `recipes.py`: `AORecipeKwargs`, `TERecipeKwargs`.
- `ao.py`: `convert_model_to_fp8_ao` and the default module filter (``accelerate.utils.ao``'s names).
- `te.py`: NVIDIA Transformer Engine where installed (``accelerate.utils.transformer_engine``'s names):
  `convert_model` (Linear/LayerNorm to TE's), `apply_fp8_autowrap` (forward in TE's ``fp8_autocast``);
  one-sentence refusals where it is not. Tested on the CPU against a stand-in TE, not on TE's kernels.
- `setup.py`: `Fp8Setup`, chosen once in `Accelerator.__init__` and applied to models in `prepare`.

Example:
    >>> from hasten.fp8 import AORecipeKwargs
    >>> AORecipeKwargs().config.pad_inner_dim
    True
"""

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

__all__ = ["AORecipeKwargs", "TERecipeKwargs"]
# imported on first use: an Accelerator without fp8 never loads the recipes
__getattr__, __dir__ = lazy_exports(__name__, {name: "recipes" for name in __all__}, globals())

if TYPE_CHECKING:
    from .recipes import AORecipeKwargs, TERecipeKwargs
