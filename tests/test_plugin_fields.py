"""The FSDP plugin holds what Accelerate 1.16's holds, because libraries read it (docs/with-libraries.md).

Each field of `FullyShardedDataParallelPlugin` after construction is compared with Accelerate's own plugin
(installed as a test dependency) built the same way, for fsdp_version 1 and 2, with and without the ``FSDP_*``
variables; so are the setters libraries call (`set_mixed_precision`, `set_auto_wrap_policy`,
`set_state_dict_type`) and what the Accelerator leaves in the plugin before `prepare`. The DeepSpeed plugin's
counterpart is tests/test_deepspeed_plugin_fields.py.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

from hasten.strategies.fsdp.plugin import FullyShardedDataParallelPlugin as Ours


pytestmark = pytest.mark.usefixtures("no_engine_variables")  # conftest: no FSDP_/ACCELERATE_ variables, state reset


def _same(ours, theirs) -> bool:
    if isinstance(theirs, functools.partial):
        return isinstance(ours, functools.partial) and ours.func is theirs.func and ours.keywords == theirs.keywords
    if callable(theirs) and getattr(theirs, "__name__", "") == "<lambda>":
        return callable(ours)
    return type(ours) is type(theirs) and ours == theirs


def _differences(ours, theirs, skip=()) -> list[str]:
    import dataclasses

    names = [f.name for f in dataclasses.fields(theirs) if f.name not in skip]
    return [f"{name}: hasten {getattr(ours, name)!r} vs Accelerate {getattr(theirs, name)!r}"
            for name in names if not _same(getattr(ours, name), getattr(theirs, name))]


# -- FSDP ------------------------------------------------------------------------------------------------------
FSDP_CASES = {
    "defaults": ({}, {}),
    "version 2": ({"fsdp_version": 2}, {}),
    "variables, version 1": ({}, {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_OFFLOAD_PARAMS": "true",
                                  "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "A,B",
                                  "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
                                  "FSDP_FORWARD_PREFETCH": "true", "FSDP_USE_ORIG_PARAMS": "true",
                                  "FSDP_ACTIVATION_CHECKPOINTING": "true", "FSDP_IGNORED_MODULES": "x.*"}),
    "variables, version 2": ({}, {"FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_OFFLOAD_PARAMS": "true",
                                  "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP", "FSDP_MIN_NUM_PARAMS": "2000",
                                  "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_ACTIVATION_CHECKPOINTING": "true",
                                  "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "false",
                                  "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_USE_ORIG_PARAMS": "true"}),
    "names, version 1": ({"fsdp_version": 1, "sharding_strategy": "hybrid_shard", "auto_wrap_policy": "size_based_wrap",
                          "cpu_offload": False, "state_dict_type": "sharded_state_dict", "mixed_precision_policy": "fp16",
                          "backward_prefetch": "BACKWARD_POST"}, {}),
    "numbers, version 1": ({"fsdp_version": 1, "sharding_strategy": "2", "state_dict_type": "3", "backward_prefetch": 1}, {}),
    "reshard strategy, version 1": ({"fsdp_version": 1, "reshard_after_forward": "SHARD_GRAD_OP"}, {}),
    "reshard text, version 2": ({"fsdp_version": 2, "reshard_after_forward": "false", "cpu_offload": True,
                                 "mixed_precision_policy": "bf16", "auto_wrap_policy": "transformer_based_wrap"}, {}),
    "precision dict, version 2": ({"fsdp_version": 2, "mixed_precision_policy": {
        "param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, "output_dtype": torch.bfloat16}}, {}),
}


@pytest.mark.parametrize("case", sorted(FSDP_CASES))
def test_fsdp_plugin_fields_are_accelerates(case, monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin as Theirs

    kwargs, env = FSDP_CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = Theirs(**kwargs)
    assert _differences(Ours(**kwargs), theirs) == []


def test_fsdp_fields_libraries_read():
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecision, ShardingStrategy, StateDictType

    # TRL's prepare_fsdp: fully_shard(model, offload_policy=fsdp_plugin.cpu_offload, ...)
    assert isinstance(Ours(fsdp_version=2, cpu_offload=True).cpu_offload, CPUOffloadPolicy)
    # diffusers' training_utils: fsdp_plugin.sharding_strategy or ShardingStrategy.FULL_SHARD
    assert Ours(fsdp_version=2).sharding_strategy is None
    assert Ours(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP").sharding_strategy is ShardingStrategy.SHARD_GRAD_OP
    # transformers' Trainer (QLoRA): fsdp_plugin.set_mixed_precision(dtype, override=True)
    plugin = Ours(fsdp_version=1, mixed_precision_policy="fp16")
    plugin.set_mixed_precision(torch.bfloat16, override=True)
    assert plugin.mixed_precision_policy == MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                                           buffer_dtype=torch.bfloat16)
    plugin.set_state_dict_type("FULL_STATE_DICT")
    assert plugin.state_dict_type is StateDictType.FULL_STATE_DICT and plugin.state_dict_config.rank0_only


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x)


def _model() -> nn.Module:
    model = nn.Sequential(Block(), Block(), nn.Linear(8, 2))
    model._no_split_modules = ["Block"]
    return model


@pytest.mark.parametrize("kwargs", [{"auto_wrap_policy": "transformer_based_wrap"},
                                    {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Linear"]},
                                    {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50},
                                    {"auto_wrap_policy": "size_based_wrap"}, {}])
@pytest.mark.parametrize("version", [1, 2])
def test_fsdp_setters_leave_what_accelerates_leave(kwargs, version):
    from accelerate.utils import FullyShardedDataParallelPlugin as Theirs

    ours, theirs = Ours(fsdp_version=version, **kwargs), Theirs(fsdp_version=version, **kwargs)
    for plugin in (ours, theirs):
        plugin.set_auto_wrap_policy(_model())
        plugin.set_mixed_precision("bf16", buffer_autocast=True)
        plugin.set_state_dict_type("FULL_STATE_DICT" if version == 2 else "SHARDED_STATE_DICT")
    assert _differences(ours, theirs) == []
    with pytest.raises(ValueError, match="Could not find the transformer layer class Missing in the model"):
        Ours(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Missing"]).set_auto_wrap_policy(_model())


def test_the_strategy_reads_the_typed_fields():
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    from hasten.strategies.fsdp.strategy import wrap_unit_filter

    model = _model()
    plugin = Ours(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP", cpu_offload=True, mixed_precision_policy="bf16",
                  auto_wrap_policy="transformer_based_wrap")
    assert (plugin.reshards, plugin.shards, plugin.is_hybrid) == (False, True, False)
    assert isinstance(plugin.offload_policy, CPUOffloadPolicy)
    assert plugin.fsdp2_precision() == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    units = [m for m in model.modules() if wrap_unit_filter(plugin, model)(m)]
    plugin.set_auto_wrap_policy(model)  # what prepare leaves there: a partial of torch's policy, read the same way
    assert units == [model[0], model[1]] == [m for m in model.modules() if wrap_unit_filter(plugin, model)(m)]
    assert not any(wrap_unit_filter(Ours(fsdp_version=2), model)(m) for m in model.modules())
    assert type(Ours(fsdp_version=2).offload_policy) is OffloadPolicy
    sized = Ours(fsdp_version=2, auto_wrap_policy="size_based_wrap", min_num_params=72)  # a Block has 72 parameters
    assert not any(wrap_unit_filter(sized, model)(m) for m in model.modules() if m is not model)


def test_a_policy_of_fsdp1s_protocol_picks_units_as_fsdp1_would():
    """PEFT's examples set `fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)`: an FSDP1 policy
    (``module, recurse, nonwrapped_numel``); it was called with the module alone (TypeError)."""
    from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

    from hasten.strategies.fsdp.strategy import wrap_unit_filter

    model = _model()
    peft_like = functools.partial(_or_policy, policies=[
        functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: m is model[2]),
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})])
    plugin = Ours(fsdp_version=2)
    plugin.auto_wrap_policy = peft_like
    is_unit = wrap_unit_filter(plugin, model)
    assert [m for m in model.modules() if is_unit(m)] == [model[0], model[1], model[2]]


def test_the_accelerator_sets_the_precision_policy_as_accelerates_state_does():
    from accelerate.utils import FullyShardedDataParallelPlugin as Theirs

    from hasten.strategies.fsdp.strategy import FSDPStrategy

    for version in (1, 2):
        ours, theirs = Ours(fsdp_version=version), Theirs(fsdp_version=version)
        FSDPStrategy.create(torch.device("cpu"), 2, "bf16", ours)
        theirs.set_mixed_precision("bf16")  # AcceleratorState: fsdp_plugin.set_mixed_precision(mixed_precision)
        assert ours.mixed_precision_policy == theirs.mixed_precision_policy
    given = Ours(fsdp_version=2, mixed_precision_policy={"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32,
                                                         "output_dtype": torch.float32})
    FSDPStrategy.create(torch.device("cpu"), 2, "bf16", given)
    assert given.mixed_precision_policy.reduce_dtype == torch.float32  # a policy given is kept
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT is FSDP1's per-process format"):
        FSDPStrategy.create(torch.device("cpu"), 2, "no", Ours(fsdp_version=1, state_dict_type="LOCAL_STATE_DICT"))


def test_fsdp_refusals_name_the_fix():
    with pytest.raises(ValueError, match="forward_prefetch is an FSDP1 setting"):
        Ours(fsdp_version=2, forward_prefetch=False)
    with pytest.raises(ValueError, match="reshard_after_forward=True is FSDP2's bool"):
        Ours(fsdp_version=1, reshard_after_forward=True)
    with pytest.raises(ValueError, match="sharding_strategy='HALF' is not one of FULL_SHARD"):
        Ours(fsdp_version=1, sharding_strategy="HALF")
    with pytest.raises(ValueError, match="needs fsdp_version=2"):
        Ours(fsdp_version=1, activation_checkpointing=True, activation_checkpointing_offload=True)
    # hasten's one extension: FSDP1's strategy given under version 2 decides resharding (Accelerate raises there)
    assert Ours(fsdp_version=2, sharding_strategy="SHARD_GRAD_OP").reshard_after_forward is False
