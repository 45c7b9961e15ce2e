"""The fp8 recipe handlers of `Accelerator(kwargs_handlers=[...])`, with Accelerate 1.16's names and defaults.

`AORecipeKwargs` drives torchao's float8 training; `TERecipeKwargs` drives
NVIDIA Transformer Engine (`hasten.fp8.te`) and refuses in one sentence where
it is not installed, as Accelerate's does. (Accelerate 1.16 removed MS-AMP's
`MSAMPRecipeKwargs` and the deprecated `FP8RecipeKwargs`; so does hasten.)

Example:
    >>> from hasten.fp8.recipes import AORecipeKwargs
    >>> recipe = AORecipeKwargs()
    >>> recipe.config.pad_inner_dim, recipe.config.enable_fsdp_float8_all_gather, recipe.config.emulate
    (True, True, False)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..core.availability import is_torchao_available, is_transformer_engine_available
from ..core.environment import str_to_bool
from ..options.kwargs import KwargsHandler

__all__ = ["AORecipeKwargs", "TERecipeKwargs", "TE_MISSING"]

TE_MISSING = ("needs NVIDIA Transformer Engine, which is not installed; install it on a machine with an NVIDIA fp8 GPU "
              "(pip install transformer_engine[pytorch]) or use AORecipeKwargs (pip install torchao).")
_TE_FORMATS = ("HYBRID", "E4M3", "E5M2")
_TE_AMAX = ("max", "most_recent")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao float8 training: the `Float8LinearConfig` and which Linear layers are converted.

    With no `config`, the config is Accelerate's: ``Float8LinearConfig(pad_inner_dim=True,
    enable_fsdp_float8_all_gather=True)`` (each settable here). With no
    `module_filter_func`, every Linear whose sizes divide by 16 is converted
    except the model's first and last Linear (`hasten.fp8.ao.filter_linear_layers`).
    To emulate fp8 matrix products in higher precision (a CPU, or a GPU
    older than Ada/Hopper), pass ``config=Float8LinearConfig(emulate=True)``.

    Example:
        >>> from torchao.float8 import Float8LinearConfig
        >>> AORecipeKwargs(config=Float8LinearConfig(emulate=True)).config.emulate
        True
    """

    config: Any = None  # a torchao.float8.Float8LinearConfig
    module_filter_func: Callable[[Any, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        if not is_torchao_available():
            raise ImportError("AORecipeKwargs needs torchao, which is not installed; install it (pip install torchao).")
        if self.config is not None:
            if self.pad_inner_dim is not None or self.enable_fsdp_float8_all_gather is not None:
                raise ValueError("AORecipeKwargs got a config and pad_inner_dim/enable_fsdp_float8_all_gather; "
                                 "set those fields on the Float8LinearConfig you pass instead.")
            return
        from torchao.float8 import Float8LinearConfig

        # As Accelerate: a field left None comes from ACCELERATE_FP8_* (`hasten launch --fp8_...`), else True
        if self.pad_inner_dim is None:
            self.pad_inner_dim = bool(str_to_bool(os.environ.get("ACCELERATE_FP8_PAD_INNER_DIM", "true")))
        if self.enable_fsdp_float8_all_gather is None:
            chosen = os.environ.get("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER")
            self._all_gather_by_default = chosen is None  # nobody asked: an FSDP-only default DeepSpeed turns off
            self.enable_fsdp_float8_all_gather = bool(str_to_bool(chosen or "true"))
        self.config = Float8LinearConfig(pad_inner_dim=self.pad_inner_dim,
                                         enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather)

    _all_gather_by_default = False

    def to_kwargs(self) -> dict[str, Any]:
        return {"config": self.config, "module_filter_func": self.module_filter_func}

    def for_deepspeed(self) -> None:
        """Fit the recipe to a DeepSpeed engine: float8 all-gather (an FSDP2 feature, on in the default recipe) is
        turned off where nobody asked for it, and refused where someone did.

        DeepSpeed casts the module to its 16-bit dtype, which cannot swap the
        float8 all-gather weight wrapper (Accelerate fails there: "Couldn't swap
        Float8Linear.weight"); without it the fp8 products are the same.

        Example:
            >>> recipe = AORecipeKwargs(); recipe.for_deepspeed(); recipe.config.enable_fsdp_float8_all_gather
            False
        """
        if not self.config.enable_fsdp_float8_all_gather:
            return
        if not self._all_gather_by_default:
            raise ValueError("torchao's float8 all-gather (enable_fsdp_float8_all_gather=True) is for FSDP2, and "
                             "DeepSpeed cannot cast its weight wrapper; under DeepSpeed pass "
                             "AORecipeKwargs(enable_fsdp_float8_all_gather=False) (or a Float8LinearConfig without it).")
        import dataclasses

        self.enable_fsdp_float8_all_gather = False
        self.config = dataclasses.replace(self.config, enable_fsdp_float8_all_gather=False)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """NVIDIA Transformer Engine's fp8 recipe (Accelerate's fields and defaults); needs transformer_engine.

    A field left None comes from ``ACCELERATE_FP8_<FIELD>`` (``hasten launch
    --fp8_margin`` etc. export them; the format's variable is
    ``ACCELERATE_FP8_FORMAT``, the override's ``ACCELERATE_FP8_OVERRIDE_FPROP``
    / ``_DGRAD`` / ``_WGRAD``), else Accelerate's default: no autocast in
    evaluation, margin 0, interval 1, ``"HYBRID"``, history 1024,
    ``"most_recent"``, no override, no MXFP8. `prepare` builds TE's
    ``DelayedScaling`` from `to_kwargs()` (`hasten.fp8.te.apply_fp8_autowrap`).

    Example:
        >>> from hasten.fp8.recipes import TERecipeKwargs
        >>> TERecipeKwargs.__dataclass_fields__["fp8_format"].name
        'fp8_format'
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if not is_transformer_engine_available():
            raise ImportError(f"{type(self).__name__} {TE_MISSING}")
        self._fill(os.environ)

    def _fill(self, env: Mapping[str, str]) -> None:
        """Set every field left None from `env`'s ACCELERATE_FP8_* variables, else Accelerate's default; check them."""
        def flag(name: str) -> bool:
            return bool(str_to_bool(env.get(f"ACCELERATE_FP8_{name}", "false")))

        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = flag("USE_AUTOCAST_DURING_EVAL")
        if self.margin is None:
            self.margin = int(env.get("ACCELERATE_FP8_MARGIN", 0))
        if self.interval is None:
            self.interval = int(env.get("ACCELERATE_FP8_INTERVAL", 1))
        if self.fp8_format is None:
            self.fp8_format = env.get("ACCELERATE_FP8_FORMAT", "HYBRID")
        self.fp8_format = self.fp8_format.upper()
        if self.fp8_format not in _TE_FORMATS:
            raise ValueError(f"fp8_format={self.fp8_format!r} must be one of {', '.join(_TE_FORMATS)}.")
        if self.amax_compute_algo is None:
            self.amax_compute_algo = env.get("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", "most_recent")
        self.amax_compute_algo = self.amax_compute_algo.lower()
        if self.amax_compute_algo not in _TE_AMAX:
            raise ValueError(f"amax_compute_algo={self.amax_compute_algo!r} must be one of {', '.join(_TE_AMAX)}.")
        if self.amax_history_len is None:
            self.amax_history_len = int(env.get("ACCELERATE_FP8_AMAX_HISTORY_LEN", 1024))
        if self.override_linear_precision is None:
            self.override_linear_precision = (flag("OVERRIDE_FPROP"), flag("OVERRIDE_DGRAD"), flag("OVERRIDE_WGRAD"))
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = flag("USE_MXFP8_BLOCK_SCALING")

    def to_kwargs(self) -> dict[str, Any]:
        """The recipe fields that differ from Accelerate's defaults (the environment's values count as set), as Accelerate's."""
        default = object.__new__(TERecipeKwargs)
        for name in _TE_FIELDS:
            setattr(default, name, None)
        default._fill({})
        return {name: getattr(self, name) for name in _TE_FIELDS if getattr(self, name) != getattr(default, name)}


_TE_FIELDS = tuple(TERecipeKwargs.__dataclass_fields__)
