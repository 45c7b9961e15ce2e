"""The peer's ``accelerate.utils.transformer_engine`` path: fp8 through NVIDIA Transformer Engine; the code lives in `hasten.fp8.te`.

Example:
    >>> from hasten.utils.transformer_engine import apply_fp8_autowrap, convert_model
    >>> convert_model.__module__
    'hasten.fp8.te'
"""

from ..fp8.te import apply_fp8_autowrap, contextual_fp8_autocast, convert_model, has_transformer_engine_layers

__all__ = ["convert_model", "has_transformer_engine_layers", "contextual_fp8_autocast", "apply_fp8_autowrap"]
