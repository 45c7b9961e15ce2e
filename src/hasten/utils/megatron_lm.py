"""``accelerate.utils.megatron_lm``'s names: hasten has no Megatron-LM engine, so each refuses when used.

The code lives in `hasten.core.unavailable`; every name takes Accelerate's parameters and raises
NotImplementedError in one sentence saying to train with DDP, FSDP or DeepSpeed instead.

Example:
    >>> from hasten.utils.megatron_lm import MegatronLMDummyScheduler
    >>> MegatronLMDummyScheduler.__name__
    'MegatronLMDummyScheduler'
"""

from ..core.unavailable import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronEngine,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
    finish_mpu_init,
    gather_across_data_parallel_groups,
    initialize,
    model_provider_func,
    prepare_data_loader,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)

__all__ = ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MegatronEngine", "MegatronLMDummyDataLoader",
           "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper", "T5TrainStep",
           "avg_losses_across_data_parallel_group", "finish_mpu_init", "gather_across_data_parallel_groups",
           "initialize", "model_provider_func", "prepare_data_loader", "prepare_model_optimizer_scheduler",
           "prepare_optimizer", "prepare_scheduler"]
