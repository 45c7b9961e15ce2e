"""File names of checkpoints and weights (``accelerate.utils.constants``).

Example:
    >>> from hasten.utils.constants import SAFE_WEIGHTS_NAME
    >>> SAFE_WEIGHTS_NAME
    'model.safetensors'
"""

from ..checkpointing.constants import *  # noqa: F401,F403 - the names are the point
from ..checkpointing.constants import __all__ as _names

__all__ = list(_names)
