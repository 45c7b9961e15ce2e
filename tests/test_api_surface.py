"""The rest of the peer's public API at its import paths: utils modules, memory, LocalSGD, join, triggers, dynamo, fp8."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import launch, results_by_rank

PATHS = {
    "hasten": ["AutocastKwargs", "DDPCommunicationHookType", "find_executable_batch_size", "synchronize_rng_states",
               "load_checkpoint_in_model", "is_rich_available"],
    "hasten.data_loader": ["prepare_data_loader", "skip_first_batches", "SeedableRandomSampler", "DataLoaderShard",
                           "BatchSamplerShard", "IterableDatasetShard", "SkipBatchSampler"],
    "hasten.launchers": ["notebook_launcher", "debug_launcher"],
    "hasten.state": ["GradientState", "is_initialized", "PartialState", "AcceleratorState"],
    "hasten.local_sgd": ["LocalSGD"],
    "hasten.memory_utils": ["find_executable_batch_size", "release_memory"],
    "hasten.utils.memory": ["find_executable_batch_size", "release_memory", "should_reduce_batch_size"],
    "hasten.utils.operations": ["gather", "gather_object", "reduce", "broadcast", "broadcast_object_list",
                                "pad_across_processes", "send_to_device", "recursively_apply", "find_batch_size"],
    "hasten.utils.dataclasses": ["AutocastKwargs", "TorchDynamoPlugin", "DDPCommunicationHookType", "DynamoBackend",
                                 "DistributedDataParallelKwargs", "ProjectConfiguration", "FullyShardedDataParallelPlugin"],
    "hasten.utils.imports": ["is_deepspeed_available", "is_transformers_available", "is_tensorboard_available",
                             "is_wandb_available", "is_mlflow_available", "is_datasets_available",
                             "is_safetensors_available", "is_torch_xla_available", "is_megatron_lm_available",
                             "is_bf16_available", "is_fp8_available", "is_cuda_available", "is_mps_available"],
    "hasten.utils.other": ["extract_model_from_parallel", "wait_for_everyone", "write_basic_config", "save", "load"],
    "hasten.utils.environment": ["patch_environment", "clear_environment", "str_to_bool", "parse_flag_from_env"],
    "hasten.utils.random": ["set_seed", "synchronize_rng_states"],
    "hasten.utils.launch": ["PrepareForLaunch"],
    "hasten.utils": ["extract_model_from_parallel", "wait_for_everyone", "patch_environment", "write_basic_config",
                     "synchronize_rng_states", "PrepareForLaunch", "find_executable_batch_size", "release_memory",
                     "AutocastKwargs", "TorchDynamoPlugin", "is_deepspeed_available", "is_torch_xla_available"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_names_resolve_at_the_peer_paths(module):
    loaded = importlib.import_module(module)
    assert [name for name in PATHS[module] if getattr(loaded, name, None) is None] == []


# -- find_executable_batch_size ------------------------------------------------------------------------
@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 10 GB"),
                                   RuntimeError("XPU out of memory")])
def test_find_executable_batch_size_takes_90_percent_on_out_of_memory(error):
    from hasten.utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, fits):
        tried.append(batch_size)
        if batch_size > fits:
            raise error
        return batch_size

    assert train(80) == 73  # Accelerate 1.16's sizes: int(size * 0.9) a try
    assert tried == [128, 115, 103, 92, 82, 73]


def test_find_executable_batch_size_reraises_other_errors_and_stops_at_zero():
    from hasten.memory_utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        broken()

    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size):
        raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(RuntimeError, match="ran out of memory at every batch size"):
        never_fits()

    @find_executable_batch_size(starting_batch_size=8, reduce_batch_size_fn=lambda: 3)
    def custom(batch_size):
        if batch_size == 8:
            raise torch.OutOfMemoryError("out of memory")
        return batch_size

    assert custom() == 3
    with pytest.raises(TypeError, match="call custom\\(\\) without it"):
        custom(8)


def test_release_memory_returns_nones():
    from hasten.utils import release_memory

    assert release_memory(torch.ones(3), torch.nn.Linear(1, 1)) == [None, None]


# -- operations with the peer's parameter names ------------------------------------------------------------
def test_operations_take_the_peer_parameter_names():
    from hasten.utils import operations as ops

    assert ops.gather(tensor=torch.tensor([1])).tolist() == [1]
    assert ops.gather_object(object=["a"]) == ["a"]
    assert ops.broadcast_object_list(object_list=[3]) == [3]
    assert ops.reduce(tensor=torch.tensor([2.0])).tolist() == [2.0]
    assert ops.pad_across_processes(tensor=torch.ones(2), dim=0).tolist() == [1.0, 1.0]
    moved = ops.send_to_device({"x": torch.ones(1), "meta": {"ids": [1]}}, "cpu", non_blocking=False, skip_keys=["ids"])
    assert moved["meta"]["ids"] == [1] and moved["x"].device.type == "cpu"
    doubled = ops.recursively_apply(lambda v, k: v * k, {"a": [2, "s"]}, 3, test_type=lambda v: isinstance(v, int))
    assert doubled == {"a": [6, "s"]}
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\) passed to `<lambda>`"):
        ops.recursively_apply(lambda t: t, ["s"], error_on_other_type=True)
    assert ops.find_batch_size({"x": torch.zeros(5, 2)}) == 5


# -- option classes ------------------------------------------------------------------------------------
def test_ddp_kwargs_keep_hook_settings_out_of_ddp_arguments():
    from hasten.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    kwargs = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD, comm_wrapper="fp16",
                                           comm_state_option={"matrix_approximation_rank": 2}, bucket_cap_mb=10)
    assert kwargs.to_kwargs() == {"bucket_cap_mb": 10}
    with pytest.raises(ValueError, match="set comm_hook='power_sgd'"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="bf16")
    with pytest.raises(ValueError, match="'power_sgd'"):
        DistributedDataParallelKwargs(comm_wrapper="power_sgd")


def test_dataloader_configuration_is_reported_back():
    from hasten import Accelerator, DataLoaderConfiguration

    given = DataLoaderConfiguration(even_batches=False, non_blocking=True, dispatch_batches=True)
    config = Accelerator(cpu=True, dataloader_config=given).dataloader_config
    assert (config.even_batches, config.non_blocking, config.dispatch_batches) == (False, True, True)


def test_autocast_handler_switches_the_block_off():
    from hasten import Accelerator, AutocastKwargs

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    with accelerator.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with accelerator.autocast(autocast_handler=AutocastKwargs(enabled=False)):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    off = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)])
    with off.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_fp8_without_a_backend_is_refused_in_one_sentence(no_fp8_backend):
    from hasten import Accelerator
    from hasten.launch.config import ConfigError, LaunchConfig

    expected = "mixed_precision='fp8' needs torchao or NVIDIA Transformer Engine and neither is installed"
    with pytest.raises(ValueError, match=expected):
        Accelerator(cpu=True, mixed_precision="fp8")
    with pytest.raises(ConfigError, match=expected):
        LaunchConfig(mixed_precision="fp8").validate()


def test_dynamo_backend_compiles_prepared_models():
    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    with pytest.raises(ValueError, match="use one of no, eager"):
        TorchDynamoPlugin(backend="warp")
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    net = torch.nn.Linear(3, 2)
    expected = net(torch.ones(1, 3))
    model = accelerator.prepare(net)
    assert model._compiled_call_impl is not None  # compiled in place: same module, same state dict keys
    assert torch.allclose(model(torch.ones(1, 3)), expected)
    assert accelerator.state.dynamo_plugin.backend.value == "EAGER"
    assert Accelerator(cpu=True).prepare(torch.nn.Linear(1, 1))._compiled_call_impl is None


# -- state --------------------------------------------------------------------------------------------
def test_state_reset_and_is_initialized():
    from hasten import Accelerator
    from hasten.state import AcceleratorState, PartialState, is_initialized

    Accelerator(cpu=True, mixed_precision="bf16")
    assert is_initialized() and AcceleratorState().mixed_precision == "bf16"
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    assert not is_initialized() and AcceleratorState().mixed_precision == "no"


def test_active_dataloader_is_the_loader_being_iterated():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(4)), batch_size=2))
    assert accelerator.gradient_state.active_dataloader is None
    seen = [accelerator.gradient_state.active_dataloader is loader for _ in loader]
    assert seen == [True, True] and accelerator.gradient_state.active_dataloader is None


def test_single_process_join_triggers_and_local_sgd_are_no_ops():
    from hasten import Accelerator
    from hasten.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with accelerator.join_uneven_inputs([model], even_batches=False), accelerator.trigger_sync_in_backward(model):
        model(torch.ones(1, 2)).sum().backward()
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled
    with pytest.raises(ValueError, match="local_sgd_steps must be an integer >= 1"):
        LocalSGD(accelerator, model, local_sgd_steps=0)


# -- data_loader, imports, other, environment, launch ----------------------------------------------------------
def test_data_loader_module_takes_the_peer_names():
    from hasten.data_loader import SeedableRandomSampler, prepare_data_loader

    loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=1), num_processes=2, process_index=1,
                                 put_on_device=False, even_batches=True, use_seedable_sampler=True)
    assert [b.item() for b in loader] == [1, 3, 5]
    with pytest.raises(ValueError, match="only applies with dispatch_batches=True"):
        prepare_data_loader(DataLoader(list(range(2))), slice_fn_for_dispatch=lambda *a, **k: a[0])
    assert list(SeedableRandomSampler(range(8), data_seed=3)) == list(SeedableRandomSampler(range(8), data_seed=3))


def test_import_probes():
    from hasten.utils import imports

    assert imports.is_torch_xla_available() is False and imports.is_megatron_lm_available() is False
    assert imports.is_safetensors_available() and imports.is_bf16_available()
    assert imports.is_cuda_available() == torch.cuda.is_available()
    assert imports.is_fp8_available() == (imports.is_torchao_available() or imports.is_transformer_engine_available())


def test_other_and_environment_helpers(tmp_path):
    from hasten.launch.config import load_config
    from hasten.utils import (PrepareForLaunch, clear_environment, extract_model_from_parallel, patch_environment,
                              synchronize_rng_states, wait_for_everyone, write_basic_config)

    net = torch.nn.Linear(2, 2)
    assert extract_model_from_parallel(torch.compile(net), keep_torch_compile=False) is net
    wait_for_everyone()
    synchronize_rng_states(["torch"])
    path = write_basic_config(mixed_precision="bf16", save_location=tmp_path / "default.yaml")
    assert load_config(path).mixed_precision == "bf16"
    assert write_basic_config(save_location=path) is False
    with patch_environment(hasten_api_test="x"):
        assert os.environ["HASTEN_API_TEST"] == "x"
    assert "HASTEN_API_TEST" not in os.environ
    with clear_environment():
        assert PrepareForLaunch(lambda: (os.environ["RANK"], os.environ["LOCAL_RANK"]), "MULTI_CPU")(1) == ("1", "1")
    assert "FORK_LAUNCHED" not in os.environ


# -- two processes: LocalSGD, join_uneven_inputs, triggers, comm hooks --------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("api_mp")
    launch("api_multiprocess.py", str(out), launch_args=("--cpu",), timeout=120)
    ranks = results_by_rank(out)
    assert sorted(ranks) == [0, 1]
    return ranks


@pytest.mark.multiprocess
def test_local_sgd_averages_every_k_steps(two_ranks):
    a, b = two_ranks[0]["local_sgd"], two_ranks[1]["local_sgd"]
    assert a[0]["grads"] != b[0]["grads"]  # no all-reduce inside LocalSGD
    assert a[0]["params"] != b[0]["params"] and a[2]["params"] != b[2]["params"]  # between syncs: local models
    assert a[1]["params"] == pytest.approx(b[1]["params"], abs=1e-6)  # steps 2 and 4 average
    assert a[3]["params"] == pytest.approx(b[3]["params"], abs=1e-6)


@pytest.mark.multiprocess
def test_triggers_and_trigger_sync_in_backward(two_ranks):
    a, b = two_ranks[0], two_ranks[1]
    assert a["triggers"] == b["triggers"] == [True, False]
    assert a["no_sync_grads"] != b["no_sync_grads"]
    assert a["triggered_grads"] == pytest.approx(b["triggered_grads"], abs=1e-6)


@pytest.mark.multiprocess
def test_join_uneven_inputs_lets_ranks_stop_at_different_batches(two_ranks):
    a, b = two_ranks[0], two_ranks[1]
    assert (a["join_batches"], b["join_batches"]) == (3, 2)  # 5 samples, even_batches=False inside the block
    assert a["join_params"] == pytest.approx(b["join_params"], abs=1e-6)
    assert a["join_even_batches_restored"] and b["join_even_batches_restored"]


@pytest.mark.multiprocess
def test_ddp_comm_hook_is_registered(two_ranks):
    a, b = two_ranks[0], two_ranks[1]
    assert a["comm_hook"] == b["comm_hook"] == "fp16_compress_hook"
    assert a["hook_grads"] == pytest.approx(b["hook_grads"], abs=1e-6)
