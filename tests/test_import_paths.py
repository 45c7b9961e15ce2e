"""Every name re-exported under the peer's import paths resolves (a script changing only its imports keeps working)."""

from __future__ import annotations

import importlib

import pytest

PATHS = {
    "hasten": ["Accelerator", "AcceleratorState", "PartialState", "DistributedType", "FullyShardedDataParallelPlugin",
               "DeepSpeedPlugin", "ParallelismConfig", "notebook_launcher", "set_seed"],
    "hasten.utils": ["FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "DummyOptim", "DummyScheduler",
                     "HfDeepSpeedConfig", "ParallelismConfig", "merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model",
                     "save_fsdp_optimizer", "load_fsdp_optimizer", "DistributedType", "gather", "set_seed"],
    "hasten.utils.deepspeed": ["DeepSpeedPlugin", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig"],
    "hasten.utils.fsdp_utils": ["merge_fsdp_weights", "save_fsdp_model", "load_fsdp_model"],
    "hasten.parallelism_config": ["ParallelismConfig"],
    "hasten.state": ["AcceleratorState", "PartialState"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_names_resolve(module):
    loaded = importlib.import_module(module)
    missing = [name for name in PATHS[module] if getattr(loaded, name, None) is None]
    assert not missing, f"{module} lacks {missing}"


def test_every_listed_name_of_hasten_utils_resolves():
    utils = importlib.import_module("hasten.utils")
    assert [name for name in utils.__all__ if getattr(utils, name, None) is None] == []


def test_distributed_type_members_scripts_compare_against():
    from hasten import DistributedType

    for member in ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM", "MULTI_NPU", "MULTI_XPU"):
        assert DistributedType[member].value == member


def test_megatron_is_refused_in_one_sentence():
    from hasten import Accelerator

    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        Accelerator(cpu=True, megatron_lm_plugin=object())


def test_named_deepspeed_plugins_must_be_plugins():
    from hasten import Accelerator

    with pytest.raises(TypeError, match="must be a hasten DeepSpeedPlugin, got object"):
        Accelerator(cpu=True, deepspeed_plugins={"student": object(), "teacher": object()})


def test_a_submodule_is_an_attribute_of_the_package_as_in_accelerate():
    import subprocess
    import sys

    code = ("import hasten, accelerate\n"
            "assert hasten.state.__name__ == 'hasten.state' and accelerate.state.__name__ == 'accelerate.state'\n"
            "assert hasten.utils.dataclasses.__name__ == 'hasten.utils.dataclasses'\n"
            "assert not hasattr(hasten, 'no_such_module')\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).returncode == 0
