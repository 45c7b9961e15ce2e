"""What transformers, TRL, PEFT and diffusers read and set on what Accelerate hands them, pinned to Accelerate 1.16.

Each test names the library line it stands for; where it can, it compares with Accelerate itself (installed as a
test dependency) in the same process. docs/with-libraries.md lists every attribute looked at, with its verdict.
"""

from __future__ import annotations

import warnings
from unittest.mock import Mock

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hasten import Accelerator
from hasten.state import AcceleratorState
from hasten.utils import DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin

from conftest import launch, results_by_rank


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _accelerate_accelerator(**kwargs):
    """Accelerate's own Accelerator, on fresh state (its singletons are its own, beside hasten's)."""
    import accelerate
    from accelerate.state import AcceleratorState as PeerState, GradientState as PeerGradientState

    PeerState._reset_state(reset_partial_state=True)
    PeerGradientState._reset_state()
    return accelerate.Accelerator(cpu=True, **kwargs)


def _plugin(module, **kwargs):
    return module.GradientAccumulationPlugin(**kwargs)


# -- gradient_state.plugin_kwargs (transformers' Trainer: `gradient_state.plugin_kwargs.get("sync_each_batch")`) --
@pytest.mark.parametrize("settings", [None, {"num_steps": 1}, {"num_steps": 3, "sync_each_batch": True},
                                      {"num_steps": 2, "adjust_scheduler": False, "sync_with_dataloader": False},
                                      {"sync_with_dataloader": False}])
def test_plugin_kwargs_hold_the_plugins_keywords_as_accelerates_do(settings):
    import accelerate.utils

    import hasten.utils

    ours = Accelerator(cpu=True, **({} if settings is None else
                                    {"gradient_accumulation_plugin": _plugin(hasten.utils, **settings)}))
    theirs = _accelerate_accelerator(**({} if settings is None else
                                        {"gradient_accumulation_plugin": _plugin(accelerate.utils, **settings)}))
    for name in ("plugin_kwargs", "num_steps", "sync_with_dataloader", "adjust_scheduler"):
        assert getattr(ours.gradient_state, name) == getattr(theirs.gradient_state, name), name
    assert ours.gradient_accumulation_steps == theirs.gradient_accumulation_steps


def test_the_trainers_sync_each_batch_lookup_finds_the_plugins_setting():
    # transformers' Trainer builds the plugin from `AcceleratorConfig.gradient_accumulation_kwargs` with num_steps=1
    # and decides per step whether to enter `no_sync` from this lookup.
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=1, sync_each_batch=True))
    assert accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False) is True
    assert GradientAccumulationPlugin(num_steps=2).to_kwargs() == {"num_steps": 2}


def test_setting_the_accumulation_steps_updates_plugin_kwargs_as_accelerates_setter():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.gradient_accumulation_steps = 4
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 4} and accelerator.gradient_state.num_steps == 4
    accelerator.gradient_state.plugin_kwargs = {"num_steps": 3}  # Accelerate's own tests assign the dict
    assert accelerator.gradient_accumulation_steps == 3


# -- native_amp (diffusers' examples: `accelerator.native_amp = False` on MPS) ---------------------------------------
@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_native_amp_reads_and_assigns_as_accelerates(precision, monkeypatch):
    monkeypatch.delenv("HASTEN_CPU_FP16", raising=False)  # fp16 on the CPU: full precision, as in Accelerate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = Accelerator(cpu=True, mixed_precision=precision), _accelerate_accelerator(mixed_precision=precision)
    assert ours.native_amp == theirs.native_amp
    for value in (True, False, True):
        outcomes = []
        for accelerator in (ours, theirs):
            accelerator.native_amp = value
            with accelerator.autocast():
                inside = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            model = accelerator.prepare(torch.nn.Linear(2, 2))
            outcomes.append((accelerator.native_amp, inside, model(torch.ones(1, 2)).dtype))
        assert outcomes[0] == outcomes[1], (value, outcomes)


# -- dataloader_config (TRL's GRPO/RLOO: `accelerator.dataloader_config.dispatch_batches = False`) --------------------
class _Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0))


def test_the_dataloader_config_is_kept_and_read_at_each_prepare():
    config = DataLoaderConfiguration(even_batches=False)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    assert accelerator.dataloader_config is config and accelerator.even_batches is False
    assert type(accelerator.prepare(DataLoader(_Stream(), batch_size=2))).__name__ == "DispatchedDataLoader"
    accelerator.dataloader_config.dispatch_batches = False
    assert accelerator.dispatch_batches is False
    assert type(accelerator.prepare(DataLoader(_Stream(), batch_size=2))).__name__ == "PreparedDataLoader"
    accelerator.even_batches = True  # Accelerate's setter writes into the configuration
    assert config.even_batches is True
    accelerator.dataloader_config = DataLoaderConfiguration(split_batches=True)  # Accelerate's test scripts swap it
    assert accelerator.split_batches is True


def test_loader_settings_are_read_only_where_accelerates_are():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(AttributeError):
        accelerator.split_batches = True  # type: ignore[misc]


# -- distributed_type and join_uneven_inputs (Accelerate's test_distributed_data_loop.py) ----------------------------
def test_distributed_type_follows_the_state_as_accelerates_does():
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.FSDP
    assert accelerator.distributed_type == DistributedType.FSDP
    assert _accelerate_accelerator().distributed_type == DistributedType.NO


def test_join_uneven_inputs_warns_and_runs_the_block_outside_data_parallel_runs():
    accelerator = Accelerator(cpu=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([Mock()]):  # one process, no kind: nothing to say
            pass
    assert caught == []
    accelerator.state.distributed_type = DistributedType.FSDP
    ran = False
    with pytest.warns(UserWarning, match="only supported for multi-GPU"):
        with accelerator.join_uneven_inputs([Mock()], even_batches=False):
            ran = True
    assert ran


@pytest.mark.multiprocess
def test_two_processes_join_save_and_load_as_accelerate_lets_them(tmp_path):
    launch("library_attributes_mp.py", str(tmp_path), launch_args=("--cpu",), timeout=150)
    ranks = results_by_rank(tmp_path)
    assert sorted(ranks) == [0, 1]
    for rank, result in ranks.items():
        assert result["distributed_type_follows_state"] and result["join_block_ran"]
        assert len(result["join_warnings"]) == 1 and "only supported for multi-GPU" in result["join_warnings"][0]
        assert result["override_warnings"] == ["Overriding even_batches is only supported for map-style datasets, "
                                               "yet some dataloaders given were iterable"]
        # a directory per process: each its own RNG and loader state, the main one's also the shared files
        assert result["saved_to"] == str(tmp_path / f"own{rank}") and result["resumed_same_batches"]
        assert result["own_files"] == ["dl_state_dict.bin", "hasten_checkpoint.json", f"random_states_{rank}.pkl"]
        assert result["own_manifest"] == {"saved_by": [rank], "split": True, "shared": rank == 0}
        assert "model.safetensors" in result["model_files"] if rank == 0 else "model.safetensors" not in result["model_files"]
        assert f"random_states_{rank}.pkl" in result["model_files"]
        assert result["model_load"].startswith(f"CheckpointError: on process 1: {tmp_path / 'model1'} holds only what")
        assert "pass that directory to load_state on every process." in result["model_load"]
        assert "async_save=True) publishes one directory" in result["async"]


def test_accelerate_use_fsdp_in_the_environment_gives_the_accelerator_an_fsdp_plugin(monkeypatch):
    """As Accelerate's Accelerator: a script started by another launcher that exports ACCELERATE_USE_FSDP=true gets
    a default plugin (which reads the FSDP_* variables)."""
    from hasten import Accelerator
    from hasten.runtime.accelerator_state import AcceleratorState
    from hasten.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT")
    try:
        plugin = Accelerator(cpu=True).state.fsdp_plugin
        assert isinstance(plugin, FullyShardedDataParallelPlugin)
        assert "SHARDED" in str(plugin.state_dict_type)
    finally:
        AcceleratorState._reset_state(True)
