"""The rest of Accelerate 1.16's public API at its import paths: what each name does here, not only that it exists.

Refused features (Megatron-LM, TPU) raise one sentence and advertise Accelerate's
parameter names; constants carry Accelerate's values; probes answer truthfully; the FSDP2 / DeepSpeed /
environment / optimizer / state helpers that hasten implements give Accelerate's results.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _fresh_state():
    from hasten.state import AcceleratorState, GradientState

    yield
    GradientState._reset_state()
    AcceleratorState._reset_state(True)


def _parameters(obj) -> list[str]:
    return list(inspect.signature(obj).parameters)


# -- refused features: one sentence, Accelerate's parameter names ------------------------------------------------------
@pytest.mark.parametrize("path, name, parameters", [
    ("hasten.utils.megatron_lm", "MegatronLMDummyScheduler", ["optimizer", "total_num_steps", "warmup_num_steps"]),
    ("hasten.utils.megatron_lm", "GPTTrainStep", ["accelerator", "args"]),
    ("hasten.utils.megatron_lm", "AbstractTrainStep", ["name"]),
    ("hasten.utils.megatron_lm", "MegatronEngine", ["accelerator", "model", "optimizer", "scheduler"]),
    ("hasten.utils.megatron_lm", "initialize", ["accelerator", "extra_args_provider", "args_defaults"]),
    ("hasten.utils.megatron_lm", "prepare_data_loader", ["accelerator", "dataloader"]),
    ("hasten.utils.dataclasses", "parse_llama_config", ["megatron_lm_plugin", "model", "batch_data"]),
    ("hasten.utils.dataclasses", "add_model_config_to_megatron_parser", ["model_type"]),
])
def test_megatron_names_take_accelerates_parameters_and_refuse(path, name, parameters):
    import importlib

    stand_in = getattr(importlib.import_module(path), name)
    assert _parameters(stand_in) == parameters
    with pytest.raises(NotImplementedError, match=f"^{name} needs the Megatron-LM engine, which hasten does not have; "
                                                  "train with DDP, FSDP or DeepSpeed instead.$"):
        stand_in(*([None] * len(parameters)))


def test_megatron_plugin_names_every_field_of_accelerates():
    from hasten.utils import MegatronLMPlugin

    fields = _parameters(MegatronLMPlugin)
    assert len(fields) == 63 and fields[:2] == ["tp_degree", "pp_degree"] and fields[-1] == "other_megatron_args"
    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        MegatronLMPlugin(tp_degree=2)


def test_tpu_install_refuses_and_bitsandbytes_quantization_takes_accelerates_parameters():
    from hasten.utils import install_xla, load_and_quantize_model
    from hasten.utils.bnb import quantize_and_offload_8bit

    with pytest.raises(NotImplementedError, match="run on CPUs or CUDA GPUs instead"):
        install_xla(upgrade=True)
    with pytest.raises(TypeError, match="must be a BnbQuantizationConfig"):  # (quantizing itself: test_big_model_bnb.py)
        load_and_quantize_model(nn.Linear(2, 2), None, device_map="auto")
    assert _parameters(load_and_quantize_model)[:3] == ["model", "bnb_quantization_config", "weights_location"]
    assert "fp16_statistics" in _parameters(quantize_and_offload_8bit)


@pytest.mark.parametrize("cls, parameters", [("AimTracker", ["run_name", "logging_dir"]),
                                             ("DVCLiveTracker", ["run_name", "live"]),
                                             ("TrackioTracker", ["run_name"]), ("CometMLTracker", ["run_name"]),
                                             ("ClearMLTracker", ["run_name"]), ("SwanLabTracker", ["run_name"])])
def test_more_trackers_take_accelerates_arguments(cls, parameters):
    import hasten.tracking

    # what each does: tests/test_trackers_more.py
    tracker = getattr(hasten.tracking, cls)
    assert [p for p in _parameters(tracker) if p != "kwargs"] == parameters


# -- constants: Accelerate's values ------------------------------------------------------------------------------------
def test_constants_have_accelerates_values():
    from hasten.utils import constants

    assert constants.FSDP2_STATE_DICT_TYPE == ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
    assert constants.CUDA_DISTRIBUTED_TYPES == ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
    assert constants.TORCH_DISTRIBUTED_OPERATION_TYPES[5:] == ["MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                                                               "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON"]
    assert constants.TORCH_LAUNCH_PARAMS[:2] == ["nnodes", "nproc_per_node"] and len(constants.TORCH_LAUNCH_PARAMS) == 23
    assert constants.PROFILE_PATTERN_NAME.format(suffix=1) == "profile_1.json"
    assert constants.WEIGHTS_PATTERN_NAME.format(suffix="-00001") == "pytorch_model-00001.bin"
    assert constants.SAFE_WEIGHTS_PATTERN_NAME.format(suffix="") == "model.safetensors"
    from hasten import utils

    # Accelerate 1.16 dropped its *_PYTORCH_VERSION constants and names each accelerator's backend and visibility
    assert [name for name in dir(utils) + dir(constants) if name.endswith("_PYTORCH_VERSION")] == ["SAGEMAKER_PYTORCH_VERSION"]
    assert constants.TORCH_DISTRIBUTED_BACKENDS["cuda"] == "nccl" and constants.TORCH_DISTRIBUTED_BACKENDS["xpu"] == "xccl"
    assert constants.DEVICE_VISIBLE_DEVICES_ENV_VARS["cuda"] == "CUDA_VISIBLE_DEVICES"


def test_profile_traces_use_the_pattern(tmp_path):
    from hasten import Accelerator
    from hasten.utils import ProfileKwargs

    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path))])
    with accelerator.profile():
        torch.ones(2).sum()
    assert (tmp_path / "profile_0.json").is_file()


# -- probes ------------------------------------------------------------------------------------------------------------
def test_probes_take_accelerates_parameters_and_answer_truthfully(monkeypatch):
    from hasten.utils import imports

    assert imports.is_numpy_available(min_version="1.0") and not imports.is_numpy_available(min_version="999.0")
    assert imports.is_bnb_available(min_version="0.1") == imports.is_bnb_available()
    assert imports.is_torch_xla_available(check_is_tpu=True) is False
    assert imports.is_npu_available(check_device=True) is False and imports.is_hpu_available(init_hccl=True) is False
    assert _parameters(imports.is_torch_xla_available) == ["check_is_tpu", "check_is_gpu"]
    assert imports.is_amdsmi_available() is False  # not installed here
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    assert imports.is_rich_available() is False  # installed, but not asked for
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert imports.is_rich_available() is True


def test_torchao_required_says_to_install_it(monkeypatch):
    from hasten.core import availability
    from hasten.utils import torchao_required

    converted = torchao_required(lambda: "converted")
    monkeypatch.setattr(availability, "is_torchao_available", lambda: False)
    with pytest.raises(ImportError, match="pip install torchao"):
        converted()
    monkeypatch.setattr(availability, "is_torchao_available", lambda: True)
    assert converted() == "converted"


def test_deepspeed_required_refuses_once_an_accelerator_without_deepspeed_exists():
    from hasten import Accelerator
    from hasten.utils import deepspeed_required

    stage = deepspeed_required(lambda: 3)
    assert stage() == 3  # no Accelerator yet
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match="needs DeepSpeed, which is not enabled"):
        stage()


# -- module trees ------------------------------------------------------------------------------------------------------
def _post_order(module, name=""):
    for child_name, child in module.named_children():
        yield from _post_order(child, f"{name}.{child_name}" if name else child_name)
    yield name, module


def test_children_bottom_up_each_module_after_its_children():
    from hasten.utils import get_module_children_bottom_up

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.ModuleList([nn.Linear(2, 2)]), nn.Tanh())
    assert get_module_children_bottom_up(model, return_fqns=True) == list(_post_order(model))
    assert get_module_children_bottom_up(model)[-1] is model


def test_module_class_by_name_and_dtensor_check():
    from hasten.utils import model_has_dtensor
    from hasten.utils.dataclasses import get_module_class_from_name

    model = nn.Sequential(nn.Sequential(nn.GELU()), nn.Linear(2, 2))
    assert get_module_class_from_name(model, "GELU") is nn.GELU
    assert get_module_class_from_name(model, "Conv2d") is None
    assert model_has_dtensor(model) is False


# -- FSDP2 helpers -----------------------------------------------------------------------------------------------------
def test_ram_efficient_loading_switches_set_what_transformers_reads(monkeypatch):
    from hasten.utils import disable_fsdp_ram_efficient_loading, enable_fsdp_ram_efficient_loading

    for name in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):  # conftest's _environment_kept undoes the switch
        monkeypatch.delenv(name, raising=False)
    enable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True" and os.environ["ACCELERATE_USE_FSDP"] == "True"
    disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"


def test_wrap_policies_follow_the_plugin():
    from hasten.utils import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

    model = nn.Sequential(Block(), nn.Linear(4, 2))
    model._no_split_modules = ["Block"]
    assert fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(), model) is None  # Accelerate's default: NO_WRAP
    by_class = fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP"), model)
    assert by_class(model[0]) and not by_class(model[1])
    with pytest.raises(ValueError, match="Could not find the transformer layer class Missing in the model"):
        fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(
            auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["Missing"]), model)
    by_size = fsdp2_prepare_auto_wrap_policy(
        FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=10), model)
    assert by_size(model[1]) is False and by_size(model[0]) is True  # 10 parameters is not more than 10
    assert fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(auto_wrap_policy="NO_WRAP"), model) is None


def test_activation_checkpointing_wraps_units_and_names_canonicalize_back():
    from hasten.utils import FullyShardedDataParallelPlugin, fsdp2_apply_ac, fsdp2_canonicalize_names

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    names = [n for n, _ in model.named_parameters()]
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["Linear"], activation_checkpointing=True,
                                            activation_checkpointing_offload=True)
    fsdp2_apply_ac(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)), model)
    assert type(model[0]).__name__ == "OffloadWrapper" and type(model[1]) is nn.ReLU
    assert list(fsdp2_canonicalize_names(dict(model.named_parameters()))) == names
    model(torch.randn(2, 4)).sum().backward()
    assert model[2]._checkpoint_wrapped_module._checkpoint_wrapped_module.weight.grad is not None
    with pytest.raises(ValueError, match="configured for FSDP"):
        fsdp2_apply_ac(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None)), model)


def test_plugin_fields_accelerate_has():
    from hasten.utils import FullyShardedDataParallelPlugin

    full = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    assert full.state_dict_config.offload_to_cpu and full.state_dict_config.rank0_only
    assert full.optim_state_dict_config.rank0_only
    sharded = FullyShardedDataParallelPlugin(fsdp_version=2)  # FSDP2's default (FSDP1's is FULL_STATE_DICT)
    assert sharded.state_dict_config.offload_to_cpu and type(sharded.state_dict_config).__name__ == "ShardedStateDictConfig"
    with pytest.raises(ValueError, match="activation_checkpointing_offload=True needs activation_checkpointing=True"):
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True)


def test_optimizer_switch_is_all_or_nothing():
    from hasten.utils import fsdp2_switch_optimizer_parameters

    first, second, new = (nn.Parameter(torch.ones(1)) for _ in range(3))
    optimizer = torch.optim.SGD([{"params": [first]}, {"params": [second]}], lr=0.1)
    with pytest.raises(KeyError, match="no sharded counterpart"):
        fsdp2_switch_optimizer_parameters(optimizer, {first.data_ptr(): new})
    assert optimizer.param_groups[0]["params"][0] is first  # unchanged
    second.data_ptr = 7  # Accelerate remembers the original pointer on the parameter
    fsdp2_switch_optimizer_parameters(optimizer, {first.data_ptr(): new, 7: new})
    assert optimizer.param_groups[0]["params"] == [new] and optimizer.param_groups[1]["params"] == [new]


def test_small_fsdp_helpers():
    from hasten.utils import ensure_weights_retied, get_fsdp2_grad_scaler
    from hasten.utils.fsdp_utils import get_parameters_from_modules

    model = nn.Sequential(nn.Embedding(3, 2), nn.Linear(2, 3, bias=False))
    model[1].weight = model[0].weight
    model._tied_weights_keys = ["1.weight"]

    def reallocate(module):
        for name, parameter in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(torch.empty_like(parameter)))
        return module

    init = ensure_weights_retied(reallocate, model, "cpu")
    init(model[0]), init(model[1])
    assert model[1].weight is model[0].weight  # still tied after each module got new parameters
    assert ensure_weights_retied(reallocate, nn.Linear(2, 2), "cpu") is reallocate
    assert get_parameters_from_modules("1", model, "cpu") == {model[0].weight}
    assert get_parameters_from_modules(None, model, "cpu") == set()
    assert get_fsdp2_grad_scaler(device="cpu", init_scale=8.0).get_scale() == 8.0


FSDP_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.tensor import DTensor
    from types import SimpleNamespace
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    from hasten.strategies.fsdp.strategy import FSDPStrategy
    from hasten.utils import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import (fsdp2_load_full_state_dict, fsdp2_prepare_model, load_fsdp_model,
                                         save_fsdp_model)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="NO_WRAP")
    strategy = FSDPStrategy(torch.device("cpu"), None, plugin, world_size=1)
    accelerator = SimpleNamespace(strategy=strategy, is_main_process=True, process_index=0, device=torch.device("cpu"),
                                  wait_for_everyone=lambda: None)
    torch.manual_seed(0)
    source = nn.Linear(3, 2)
    model = fsdp2_prepare_model(accelerator, nn.Linear(3, 2))
    out = {"sharded": isinstance(model.weight, DTensor), "again": fsdp2_prepare_model(accelerator, model) is model}
    fsdp2_load_full_state_dict(accelerator, model, source.state_dict())
    out["loaded"] = torch.equal(model.weight.full_tensor(), source.weight)
    save_fsdp_model(plugin, accelerator, model, sys.argv[1], use_dcp=False)
    copy = fsdp2_prepare_model(accelerator, nn.Linear(3, 2))
    load_fsdp_model(plugin, accelerator, copy, sys.argv[1], use_dcp=False)
    out["per_rank"] = torch.equal(copy.weight.full_tensor(), source.weight)
    import os
    out["files"] = sorted(os.listdir(sys.argv[1]))
    dist.destroy_process_group()
    print(json.dumps(out))
""")


def test_fsdp2_prepare_load_and_per_process_files_on_a_one_process_group(tmp_path):
    result = subprocess.run([sys.executable, "-c", FSDP_SCRIPT, str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"sharded": True, "again": True, "loaded": True, "per_rank": True,
                   "files": ["pytorch_model_fsdp_0_rank0.bin"]}


def test_fsdp2_prepare_model_needs_an_fsdp_run():
    from hasten import Accelerator
    from hasten.utils import fsdp2_prepare_model

    with pytest.raises(ValueError, match="sharded by FSDP"):
        fsdp2_prepare_model(Accelerator(cpu=True), nn.Linear(2, 2))


def test_param_init_fn_gives_meta_modules_their_storage():
    from hasten.strategies.fsdp.strategy import _materialize

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    seen = []

    def init(module):
        seen.append(type(module).__name__)
        return module.to_empty(device="cpu", recurse=False)

    _materialize(model, torch.device("cpu"), init)
    assert seen == ["Linear", "Linear"] and not any(p.is_meta for p in model.parameters())


# -- DeepSpeed helpers -------------------------------------------------------------------------------------------------
def test_active_deepspeed_plugin():
    from hasten import Accelerator
    from hasten.utils import DistributedType, get_active_deepspeed_plugin

    with pytest.raises(ValueError, match="not configured for deepspeed"):
        get_active_deepspeed_plugin(Accelerator(cpu=True).state)
    student, teacher = SimpleNamespace(selected=False), SimpleNamespace(selected=True)
    state = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, deepspeed_plugins={"s": student, "t": teacher})
    assert get_active_deepspeed_plugin(state) is teacher


def test_deepspeed_cpu_optimizer_choice():
    from hasten.strategies.deepspeed.helpers import deepspeed_cpu_optimizer_for

    params = [nn.Parameter(torch.ones(1))]
    assert deepspeed_cpu_optimizer_for(torch.optim.Adam(params, lr=0.5, weight_decay=0.1)) == (
        "deepspeed.ops.adam", "DeepSpeedCPUAdam", {"lr": 0.5, "weight_decay": 0.1, "adamw_mode": False})
    assert deepspeed_cpu_optimizer_for(torch.optim.Adagrad(params))[:2] == ("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad")
    lion = type("Lion32bit", (torch.optim.SGD,), {"__module__": "bitsandbytes.optim.lion"})(params, lr=0.1)
    assert deepspeed_cpu_optimizer_for(lion)[:2] == ("deepspeed.ops.lion", "DeepSpeedCPULion")
    eight_bit = type("AdamW8bit", (torch.optim.SGD,), {"__module__": "bitsandbytes.optim.adamw"})(params, lr=0.1)
    assert deepspeed_cpu_optimizer_for(eight_bit)[2]["adamw_mode"] is False


def test_gathered_parameters_is_a_plain_block_without_zero3():
    from hasten.utils import GatheredParameters

    weight = nn.Parameter(torch.ones(2))
    with GatheredParameters([weight], modifier_rank=0):
        weight.data.mul_(2)
    assert weight.tolist() == [2.0, 2.0]


# -- operations --------------------------------------------------------------------------------------------------------
def test_shape_helpers_and_operation_decorators():
    from hasten.core.errors import DistributedOperationException
    from hasten.utils.operations import (chained_operation, gather_tensor_shape, get_shape, is_torch_xpu_tensor,
                                         verify_operation)

    assert get_shape([torch.ones(2, 1), {"a": torch.ones(3)}]) == [[2, 1], {"a": [3]}]
    shape, code = gather_tensor_shape(torch.ones(4, 2, dtype=torch.int64))
    assert shape.tolist() == [4, 2] and code == 9
    with pytest.raises(ValueError, match="exactly one process"):
        gather_tensor_shape(None)
    assert is_torch_xpu_tensor(torch.ones(1)) is False
    assert verify_operation(lambda tensor: tensor + 1)(tensor=torch.zeros(1)).tolist() == [1.0]

    @chained_operation
    def step():
        raise DistributedOperationException("shapes differ")

    with pytest.raises(DistributedOperationException, match="inside .*step failed") as raised:
        step()
    assert str(raised.value.__cause__) == "shapes differ"


# -- environment -------------------------------------------------------------------------------------------------------
def test_p2p_check_and_gpu_facts(monkeypatch):
    from hasten.launch import gpus
    from hasten.utils.environment import check_cuda_p2p_ib_support

    monkeypatch.setattr(gpus, "get_gpu_info", lambda: (["NVIDIA GeForce RTX 4090"] * 2, 2))
    monkeypatch.setattr(gpus, "get_driver_version", lambda: "535.10.01")
    assert check_cuda_p2p_ib_support() is False
    monkeypatch.setattr(gpus, "get_driver_version", lambda: "550.54.14")
    assert check_cuda_p2p_ib_support() is True
    monkeypatch.setattr(gpus, "get_gpu_info", lambda: (["NVIDIA H100"] * 8, 8))
    assert check_cuda_p2p_ib_support() is True
    monkeypatch.undo()
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="nvidia-smi"):
        gpus.get_gpu_info()
    assert check_cuda_p2p_ib_support() is True  # cannot tell: nothing against it


def test_numa_affinity(monkeypatch):
    from hasten.process import affinity
    from hasten.utils.environment import override_numa_affinity, set_numa_affinity

    assert affinity.parse_cpu_list("0-2, 5,7-8") == [0, 1, 2, 5, 7, 8]
    before = os.sched_getaffinity(0)
    if not torch.cuda.is_available():
        override_numa_affinity(0, verbose=True)
        set_numa_affinity(0)
        assert os.sched_getaffinity(0) == before  # no GPU: nothing pinned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(affinity, "_nvidia_cores", lambda index: sorted(before))
    override_numa_affinity(0)
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("flag, pinned", [("1", [0]), ("false", []), (None, [])])
def test_partial_state_pins_its_cores_when_accelerate_cpu_affinity_is_set(monkeypatch, flag, pinned):
    """Accelerate's PartialState reads ACCELERATE_CPU_AFFINITY (`launch --enable_cpu_affinity` exports it)."""
    from hasten import PartialState
    from hasten.process import affinity

    calls: list[int] = []
    monkeypatch.setattr(affinity, "set_numa_affinity", lambda index: calls.append(index))
    if flag is None:
        monkeypatch.delenv("ACCELERATE_CPU_AFFINITY", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_CPU_AFFINITY", flag)
    PartialState(cpu=True)
    assert calls == pinned


# -- state, optimizer, launchers, the Accelerator ---------------------------------------------------------------------
def test_state_names():
    from hasten.state import AcceleratorState, DistributedType, ThreadLocalSharedDict, do_nothing

    class Shared:
        state = ThreadLocalSharedDict()

    Shared().state["a"] = 1
    assert Shared.state == {"a": 1} and do_nothing(1, x=2) is None and DistributedType.NO == "NO"
    with pytest.raises(ValueError, match="properly initialize your accelerator"):
        AcceleratorState(mixed_precision="bf16")
    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        AcceleratorState(megatron_lm_plugin=object())


def test_accelerator_state_settings_after_an_accelerator():
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    Accelerator(cpu=True, mixed_precision="bf16")
    assert AcceleratorState(mixed_precision="bf16").mixed_precision == "bf16"
    with pytest.raises(ValueError, match="already been initialized.*mixed_precision='fp16'"):
        AcceleratorState(mixed_precision="fp16")


def test_accelerated_optimizer_as_accelerate_builds_it():
    from hasten.optimizer import AcceleratedOptimizer, move_to_device, patch_optimizer_step

    weight = nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.1), device_placement=True, scaler=scaler)
    assert optimizer.scaler is scaler and optimizer.device_placement is True
    scaler.scale((weight * torch.tensor([float("inf"), 1.0])).sum()).backward()
    optimizer.step()
    assert optimizer.step_was_skipped and weight.tolist() == [1.0, 1.0] and scaler.get_scale() == 2.0
    optimizer.zero_grad()
    scaler.scale(weight.sum()).backward()
    optimizer.step()
    assert not optimizer.step_was_skipped and weight.tolist() == pytest.approx([0.9, 0.9])
    step = patch_optimizer_step(optimizer, lambda: "stepped")
    assert step() == "stepped" and optimizer._accelerate_step_called
    state = {"step": torch.tensor(1.0), "list": [torch.ones(1)], "n": 3}
    moved = move_to_device(state, "meta")
    assert moved["step"].is_meta and moved["list"][0].is_meta and moved["n"] == 3


def test_launchers_probe():
    import hasten.launchers

    assert hasten.launchers.test_launch() is None


def test_accelerator_parallel_ranks_and_plugin_arguments():
    from hasten import Accelerator, ParallelismConfig

    plain = Accelerator(cpu=True)
    assert plain.is_composable_parallelism_enabled is False
    with pytest.raises(RuntimeError, match="parallelism configuration"):
        plain.context_parallel_rank  # noqa: B018
    with pytest.raises(NotImplementedError, match="prepare_pippy"):
        plain.pipeline_parallel_rank  # noqa: B018
    assert Accelerator(cpu=True, parallelism_config=ParallelismConfig()).context_parallel_rank == 0
    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        Accelerator(cpu=True, megatron_lm_plugin=object())
    with pytest.raises(ValueError, match="not both"):
        Accelerator(cpu=True, deepspeed_plugin=object(), deepspeed_plugins=object())


# -- bitsandbytes names that only look at a model ---------------------------------------------------------------------
def test_bnb_config_and_model_inspection():
    from hasten.utils import BnbQuantizationConfig, CustomDtype, has_4bit_bnb_layers
    from hasten.utils.bnb import get_keys_to_not_convert, get_parameter_device

    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16", bnb_4bit_quant_type="nf4")
    assert config.torch_dtype is torch.bfloat16 and config.target_dtype == CustomDtype.INT4
    with pytest.raises(ValueError, match="can't be both True"):
        BnbQuantizationConfig(load_in_4bit=True, load_in_8bit=True)
    with pytest.raises(ValueError, match=r"bnb_4bit_quant_type must be in \['fp4','nf4'\] but found int4"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int4")
    model = nn.Sequential(nn.Embedding(3, 2), nn.Linear(2, 2), nn.Linear(2, 3, bias=False))
    model[2].weight = model[0].weight
    assert sorted(get_keys_to_not_convert(model)) == ["0", "2", "2"]  # tied weights, and the head
    base = nn.Sequential(nn.Linear(2, 2))
    base.base_model_prefix = "transformer"
    assert get_keys_to_not_convert(base) == []
    assert get_parameter_device(model) == torch.device("cpu")
    four_bit = type("Linear4bit", (nn.Linear,), {"__module__": "bitsandbytes.nn.modules"})
    assert has_4bit_bnb_layers(nn.Sequential(four_bit(2, 2))) and not has_4bit_bnb_layers(model)
