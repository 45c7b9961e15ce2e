"""The peer's ``accelerate.utils.deepspeed`` path: names only; the code lives in `hasten.strategies.deepspeed`.

Example:
    >>> from hasten.utils.deepspeed import DeepSpeedPlugin
    >>> DeepSpeedPlugin(zero_stage=3).zero_stage
    3
"""

from ..core.errors import DeepSpeedConfigError
from ..strategies.deepspeed.config import HfDeepSpeedConfig, require_deepspeed
from ..strategies.deepspeed.dummies import DummyOptim, DummyScheduler
from ..strategies.deepspeed.plugin import DeepSpeedPlugin

__all__ = ["DeepSpeedPlugin", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "DeepSpeedConfigError",
           "require_deepspeed"]
