"""The peer's ``accelerate.utils.deepspeed`` path: names only; the code lives in `hasten.strategies.deepspeed`.

Example:
    >>> from hasten.utils.deepspeed import DeepSpeedPlugin
    >>> DeepSpeedPlugin(zero_stage=3).zero_stage
    3
"""

from ..core.errors import DeepSpeedConfigError
from ..strategies.deepspeed.config import HfDeepSpeedConfig, require_deepspeed
from ..strategies.deepspeed.dummies import DummyOptim, DummyScheduler
from ..strategies.deepspeed.helpers import get_active_deepspeed_plugin, map_pytorch_optim_to_deepspeed
from ..strategies.deepspeed.plugin import DeepSpeedPlugin
from ..strategies.deepspeed.wrappers import DeepSpeedEngineWrapper, DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper

__all__ = ["DeepSpeedPlugin", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig", "DeepSpeedConfigError",
           "require_deepspeed", "DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper",
           "get_active_deepspeed_plugin", "map_pytorch_optim_to_deepspeed"]
