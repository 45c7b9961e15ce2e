"""Names of Accelerate features hasten does not have yet: they exist, so scripts import, and refuse when used.

A script that only names them in a branch it never takes (`if
accelerator.distributed_type == DistributedType.MEGATRON_LM: ...`) runs
unchanged; one that creates them gets one sentence saying what is missing
and what to use instead.

Example:
    >>> from hasten.core.unavailable import MegatronLMDummyScheduler
    >>> MegatronLMDummyScheduler(None)
    Traceback (most recent call last):
    ...
    NotImplementedError: MegatronLMDummyScheduler needs the Megatron-LM engine, which hasten does not have; train with DDP, FSDP or DeepSpeed instead.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MegatronLMPlugin", "MegatronLMDummyScheduler", "MegatronLMDummyDataLoader", "AbstractTrainStep", "GPTTrainStep",
    "BertTrainStep", "T5TrainStep", "avg_losses_across_data_parallel_group",
]

_MEGATRON = "needs the Megatron-LM engine, which hasten does not have; train with DDP, FSDP or DeepSpeed instead."


def _refused(name: str, reason: str) -> type:
    """A class named `name` whose construction raises NotImplementedError("<name> <reason>")."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{name} {reason}")

    doc = (f"Not available in hasten: creating it raises NotImplementedError ({name} {reason})\n\n"
           f"Example:\n    >>> from hasten.core.unavailable import {name}\n    >>> {name}.__name__\n    '{name}'\n")
    return type(name, (), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


MegatronLMPlugin = _refused("MegatronLMPlugin", _MEGATRON)
MegatronLMDummyScheduler = _refused("MegatronLMDummyScheduler", _MEGATRON)
MegatronLMDummyDataLoader = _refused("MegatronLMDummyDataLoader", _MEGATRON)
AbstractTrainStep = _refused("AbstractTrainStep", _MEGATRON)
GPTTrainStep = _refused("GPTTrainStep", _MEGATRON)
BertTrainStep = _refused("BertTrainStep", _MEGATRON)
T5TrainStep = _refused("T5TrainStep", _MEGATRON)


def avg_losses_across_data_parallel_group(losses: Any) -> Any:
    """Not available: a Megatron-LM helper; raises NotImplementedError in one sentence.

    Example:
        >>> avg_losses_across_data_parallel_group([])
        Traceback (most recent call last):
        ...
        NotImplementedError: avg_losses_across_data_parallel_group needs the Megatron-LM engine, which hasten does not have; train with DDP, FSDP or DeepSpeed instead.
    """
    raise NotImplementedError(f"avg_losses_across_data_parallel_group {_MEGATRON}")
