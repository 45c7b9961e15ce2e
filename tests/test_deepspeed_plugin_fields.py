"""The DeepSpeed plugin holds what Accelerate 1.16's holds, because libraries read it (docs/with-libraries.md).

Each field of `DeepSpeedPlugin` and its `deepspeed_config` after construction is compared with Accelerate's own
plugin (installed as a test dependency) built the same way, with and without the ``ACCELERATE_DEEPSPEED_*``
variables; so are `set_mixed_precision`, `HfDeepSpeedConfig.is_true`, what the Accelerator leaves in the plugin
before `prepare`, and what transformers learns from it (`set_deepspeed_weakref`, `TrainingArguments`).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from torch import nn

from conftest import run_with_timeout


pytestmark = pytest.mark.usefixtures("no_engine_variables")  # conftest: no FSDP_/ACCELERATE_ variables, state reset


def _same(ours, theirs) -> bool:
    return type(ours) is type(theirs) and ours == theirs


def _differences(ours, theirs, skip=()) -> list[str]:
    import dataclasses

    names = [f.name for f in dataclasses.fields(theirs) if f.name not in skip]
    return [f"{name}: hasten {getattr(ours, name)!r} vs Accelerate {getattr(theirs, name)!r}"
            for name in names if not _same(getattr(ours, name), getattr(theirs, name))]


ZERO2_FILE = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"}},
              "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4,
              "bf16": {"enabled": "auto"}}
DS_CASES = {
    "defaults": ({}, {}),
    "fields": ({"zero_stage": 3, "gradient_clipping": 0.5, "gradient_accumulation_steps": 2, "offload_param_device": "cpu",
                "offload_optimizer_device": "nvme", "offload_optimizer_nvme_path": "/nvme", "zero3_save_16bit_model": True}, {}),
    "variables": ({}, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_GRADIENT_CLIPPING": "1.0",
                       "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
                       "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
                       "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false", "ACCELERATE_FP8_OPT_LEVEL": "O2"}),
    "variables with a file": ({"hf_ds_config": ZERO2_FILE}, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                                                           "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}),
    "file from the variable": ({}, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": json.dumps(ZERO2_FILE)}),
    "zero3 init from the variable": ({"zero_stage": 3}, {"ACCELERATE_DEEPSPEED_ZERO3_INIT": "false"}),
    "file without accumulation": ({"hf_ds_config": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}},
                                  {}),
}


@pytest.mark.parametrize("case", sorted(DS_CASES))
def test_deepspeed_plugin_fields_are_accelerates(case, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin as Theirs

    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    kwargs, env = DS_CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ours, theirs = OursDS(**kwargs), Theirs(**kwargs)
    assert _differences(ours, theirs, skip=("hf_ds_config",)) == []
    # the config libraries read; Accelerate sets steps_per_print=inf, hasten a large int (both print nothing)
    assert {**ours.deepspeed_config, "steps_per_print": 0} == {**theirs.deepspeed_config, "steps_per_print": 0}
    assert ours.hf_ds_config.is_zero3() == theirs.hf_ds_config.is_zero3()
    assert ours.hf_ds_config.is_offload() == theirs.hf_ds_config.is_offload()


def test_an_accumulation_given_to_the_accelerator_wins_over_the_1_written_for_a_file_without_one():
    """Accelerate writes 1 there too, but at prepare overrides the Accelerator's number with it (with a warning)."""
    from hasten import Accelerator
    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    plugin = OursDS(hf_ds_config={"zero_optimization": {"stage": 2}})
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1
    accelerator = Accelerator(gradient_accumulation_steps=4, deepspeed_plugin=plugin)
    assert accelerator.gradient_accumulation_steps == 4 == plugin.get_value("gradient_accumulation_steps")


def test_zero3_init_flag_with_another_stage_warns_and_goes_on_as_accelerates():
    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    with pytest.warns(UserWarning, match="zero3_init_flag only applies to ZeRO stage 3"):
        plugin = OursDS(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False
    assert OursDS(zero_stage=3).zero3_init_flag is True  # Accelerate's default: whether the config is ZeRO-3


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize("file", [None, {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},
                                         "fp16": {"enabled": "auto"}}])
def test_set_mixed_precision_fills_the_config_as_accelerates(precision, file):
    from accelerate.utils import DeepSpeedPlugin as Theirs

    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    ours, theirs = OursDS(hf_ds_config=file), Theirs(hf_ds_config=file)
    ours.set_mixed_precision(precision)
    theirs.set_mixed_precision(precision)
    for section in ("fp16", "bf16"):
        assert ours.deepspeed_config[section] == theirs.deepspeed_config[section]
    with pytest.raises(ValueError, match="enables fp16"):
        OursDS(hf_ds_config={"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}).set_mixed_precision("bf16")


def test_is_true_counts_auto_as_accelerates_does():
    from accelerate.utils.deepspeed import HfDeepSpeedConfig as Theirs

    from hasten.utils.deepspeed import HfDeepSpeedConfig as OursConfig

    config = {"bf16": {"enabled": "auto"}, "fp16": {"enabled": False}, "a": "false", "b": 0}
    for key in ("bf16.enabled", "fp16.enabled", "a", "b", "missing"):
        assert OursConfig(config).is_true(key) == Theirs(config).is_true(key), key
        assert OursConfig(config).is_false(key) == Theirs(config).is_false(key), key


@pytest.fixture
def _transformers_forgets():
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    yield
    unset_hf_deepspeed_config()


@pytest.mark.usefixtures("_transformers_forgets")
def test_the_accelerator_tells_transformers_and_fills_the_precision_before_prepare():
    from transformers.integrations.deepspeed import deepspeed_config, is_deepspeed_zero3_enabled

    from hasten import Accelerator
    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    accelerator = Accelerator(mixed_precision="bf16", deepspeed_plugin=OursDS(zero_stage=3))
    # Accelerate's test_accelerate_state_deepspeed / test_init_zero3; the weakref carries the bf16 section
    assert accelerator.state.deepspeed_plugin.deepspeed_config["bf16"]["enabled"] is True
    assert is_deepspeed_zero3_enabled() and deepspeed_config()["bf16"] == {"enabled": True}
    assert deepspeed_config()["gradient_accumulation_steps"] == 1 and "train_batch_size" not in deepspeed_config()
    plugin = accelerator.state.deepspeed_plugin
    with plugin.zero3_init_context_manager(enable=False):
        assert plugin.zero3_init_flag is False and is_deepspeed_zero3_enabled()  # as Accelerate 1.16: only the flag
    assert plugin.zero3_init_flag is True


def test_moe_layers_become_zero3_leaf_modules(monkeypatch):
    pytest.importorskip("deepspeed")
    from hasten.utils.deepspeed import DeepSpeedPlugin as OursDS

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(4, 4)

    model = nn.Sequential(Experts(), nn.Linear(4, 4))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "Experts")
    OursDS(zero_stage=3).set_moe_leaf_modules(model)
    assert getattr(model[0], "_z3_leaf", False) and not getattr(model[1], "_z3_leaf", False)


TRAINING_ARGUMENTS = """
import hasten.as_accelerate
import json, os
from transformers import TrainingArguments
from transformers.integrations.deepspeed import deepspeed_config, is_deepspeed_zero3_enabled
args = TrainingArguments(output_dir=os.environ["OUT"], use_cpu=True, bf16=True, report_to=[])
plugin = args.deepspeed_plugin
print("RESULT", json.dumps({"module": type(plugin).__module__, "stage": plugin.zero_stage, "clip": plugin.gradient_clipping,
                            "zero3": is_deepspeed_zero3_enabled(), "bf16": deepspeed_config()["bf16"]}))
"""


def test_training_arguments_build_a_plugin_from_the_launchers_variables(tmp_path):
    """`hasten launch --use_deepspeed --as-accelerate`: TrainingArguments builds DeepSpeedPlugin() and calls
    set_mixed_precision / set_deepspeed_weakref (it raised AttributeError)."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "OUT": str(tmp_path), "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
           "ACCELERATE_GRADIENT_CLIPPING": "0.5", "HF_HUB_OFFLINE": "1"}
    result = run_with_timeout([sys.executable, "-c", TRAINING_ARGUMENTS], 120, env)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line[7:]) == {"module": "hasten.strategies.deepspeed.plugin", "stage": 3, "clip": 0.5,
                                    "zero3": True, "bf16": {"enabled": True}}
