"""``accelerate.utils.megatron_lm``'s names: hasten has no Megatron-LM engine, so each refuses when used.

Example:
    >>> from hasten.utils.megatron_lm import MegatronLMDummyScheduler
    >>> MegatronLMDummyScheduler.__name__
    'MegatronLMDummyScheduler'
"""

from .unavailable import (  # noqa: F401 - re-exported at the peer's path
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
)

__all__ = ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MegatronLMDummyDataLoader",
           "MegatronLMDummyScheduler", "T5TrainStep", "avg_losses_across_data_parallel_group"]
