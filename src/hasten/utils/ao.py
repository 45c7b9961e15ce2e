"""The peer's ``accelerate.utils.ao`` path: torchao float8 conversion; the code lives in `hasten.fp8.ao`.

Example:
    >>> from hasten.utils.ao import filter_linear_layers
    >>> import torch
    >>> filter_linear_layers(torch.nn.Linear(16, 16), "head", ["head"])
    False
"""

from ..fp8.ao import (  # noqa: F401
    __all__,
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
