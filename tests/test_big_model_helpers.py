"""Big-model helpers: offloaded state dicts, align_module_device, layerwise casting, load_state_dict,
broadcast_from_rank0 / full_state_dict, and the small facts of `accelerate.utils.modeling`."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hasten.big_modeling import attach_layerwise_casting_hooks, cpu_offload, disk_offload, dispatch_model
from hasten.big_modeling.dispatch import init_empty_weights, load_checkpoint_and_dispatch
from hasten.big_modeling.loading import load_checkpoint_in_model
from hasten.big_modeling.sizes import set_module_tensor_to_device
from hasten.checkpointing.model_files import write_model_files
from hasten.hooks import LayerwiseCastingHook, ModelHook, add_hook_to_module
from hasten.utils.modeling import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_same,
    check_tied_parameters_in_config,
    fallback_allocate,
    get_grad_scaler,
    get_mixed_precision_context_manager,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    is_peft_model,
    load_state_dict,
)

META = torch.device("meta")


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)
        self.register_buffer("scratch", torch.ones(width), persistent=False)  # not in the state dict

    def forward(self, x):
        return torch.relu(self.norm(self.linear(x))) * self.scratch


def make_model(blocks: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(blocks)]).eval()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
    return model


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def assert_same_state(state: dict, expected: dict) -> None:
    assert list(state) == list(expected)
    for name, tensor in expected.items():
        assert state[name].device.type == "cpu" and torch.equal(state[name], tensor), name


# ---------------------------------------------------------------- offloaded state dicts and align_module_device

@pytest.mark.parametrize("how", ["disk", "cpu", "dispatch"])
def test_state_dict_of_an_offloaded_model_equals_the_original(tmp_path, how):
    model = make_model()
    expected, x = snapshot(model), torch.randn(4, 8)
    with torch.no_grad():
        reference = model(x)
    if how == "disk":
        model = disk_offload(model, tmp_path, execution_device="cpu", offload_buffers=True)
    elif how == "cpu":
        model = cpu_offload(model, execution_device="cpu")
    else:  # block 0 stays in memory; the disk blocks are loaded whole (one hook each), not per submodule
        model = dispatch_model(model, {"0": "cpu", "1": "disk", "2": "disk"}, offload_dir=tmp_path,
                               preload_module_classes=["Block"])
        assert has_offloaded_params(model[1]) and not has_offloaded_params(model[0])
    assert model[1].linear.weight.device == META
    state = get_state_dict_offloaded_model(model)
    assert_same_state(state, expected)
    assert model[1].linear.weight.device == META  # everything went back off-device
    if how != "cpu":  # (cpu offload: like state_dict(), the tensors are the offloaded copies themselves)
        state["1.linear.weight"].add_(1)  # a private copy of the disk weights: writable, the model does not see it
    with torch.no_grad():
        assert torch.equal(model(x), reference)


def test_align_module_device_brings_offloaded_weights_in_and_puts_them_back(tmp_path):
    model = make_model()
    expected = snapshot(model)
    model = disk_offload(model, tmp_path, execution_device="cpu")
    layer = model[0].linear
    assert has_offloaded_params(layer) and layer.weight.device == META
    with align_module_device(layer), torch.no_grad():
        assert layer.weight.device.type == "cpu" and torch.equal(layer.weight, expected["0.linear.weight"])
        layer.weight.mul_(0)  # a private copy, not the read-only disk mapping (a write there would crash)
    assert layer.weight.device == META and layer.bias.device == META
    with align_module_device(layer, execution_device="cpu"):  # disk weights are unchanged by that write
        assert torch.equal(layer.weight, expected["0.linear.weight"])
    assert layer._hf_hook.execution_device == "cpu"

    plain = nn.Linear(2, 2)
    weight = plain.weight
    with align_module_device(plain):  # no hook, no device: nothing moves
        assert plain.weight is weight
    with align_module_device(plain, "cpu"):
        assert plain.weight.device.type == "cpu"
    assert not has_offloaded_params(plain)


def test_cpu_offloaded_writes_persist_and_state_dict_from_offload(tmp_path):
    model = cpu_offload(make_model(), execution_device="cpu")
    layer = model[2].linear
    with align_module_device(layer), torch.no_grad():
        layer.bias.fill_(3.0)  # the offloaded copy lives in memory: the write stays
    state = get_state_dict_from_offload(layer, "2.linear.bias", {"2.linear.weight": None, "2.linear.bias": None})
    assert torch.equal(state["2.linear.bias"], torch.full((8,), 3.0)) and state["2.linear.weight"].shape == (8, 8)
    assert layer.bias.device == META
    plain = nn.Linear(2, 2)  # not offloaded: its tensors as they are, no move
    assert get_state_dict_from_offload(plain, "weight", {"weight": None})["weight"] is not None


# ---------------------------------------------------------------- layerwise casting

def test_layerwise_casting_stores_low_precision_and_computes_in_fp32():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Sequential(nn.Linear(32, 32), nn.GELU()),
                          nn.Linear(32, 4))
    x = torch.randn(3, 16)
    with torch.no_grad():
        reference = model(x)
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32)
    assert [m.weight.dtype for m in (model[0], model[1], model[2][0], model[3])] == [
        torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16]  # the norm keeps its dtype
    assert isinstance(model[0]._hf_hook, LayerwiseCastingHook)
    seen = []

    class Spy(ModelHook):  # runs after the casting hook's pre_forward: sees what the forward computes with
        def pre_forward(self, module, *args, **kwargs):
            seen.append(module.weight.dtype)
            return args, kwargs

    add_hook_to_module(model[3], Spy(), append=True)
    with torch.no_grad():
        output = model(x)
    assert seen == [torch.float32]  # cast up just for the forward ...
    assert model[3].weight.dtype == torch.bfloat16  # ... and down again after it
    assert output.dtype == torch.float32 and torch.allclose(output, reference, atol=3e-2, rtol=3e-2)
    assert not torch.equal(output, reference)  # the weights really were rounded to bfloat16


def test_layerwise_casting_skips_and_refusals():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)), nn.Conv1d(1, 1, 1))
    attach_layerwise_casting_hooks(model, torch.float16, torch.float32, skip_modules_pattern=r"^1",
                                   skip_modules_classes=nn.Conv1d)  # one string is one pattern
    assert [model[0].weight.dtype, model[1][0].weight.dtype, model[2].weight.dtype] == [
        torch.float16, torch.float32, torch.float32]
    with pytest.raises(ValueError, match="storage_dtype=torch.int8 is not a floating-point"):
        attach_layerwise_casting_hooks(nn.Linear(2, 2), torch.int8, torch.float32)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")
def test_layerwise_casting_float8_storage_after_cpu_offload():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    x = torch.randn(2, 8)
    with torch.no_grad():
        reference = model(x)
    model = cpu_offload(model, execution_device="cpu")
    attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.bfloat16)
    assert has_offloaded_params(model[0])  # found inside the SequentialHook next to the casting hook
    with torch.no_grad():
        output = model(x.to(torch.bfloat16))  # inputs come in the compute dtype
    assert output.dtype == torch.bfloat16 and torch.allclose(output.float(), reference, atol=0.25, rtol=0.25)
    assert model[0].weight.device == META and model[0].weight.dtype == torch.float8_e4m3fn


# ---------------------------------------------------------------- load_state_dict

def test_load_state_dict_of_safetensors_and_torch_files(tmp_path):
    tensors = {"a.weight": torch.randn(3, 2), "b.bias": torch.arange(4, dtype=torch.int64),
               "c.half": torch.ones(2, dtype=torch.bfloat16)}
    save_file(tensors, tmp_path / "w.safetensors", metadata={"format": "pt"})
    torch.save(tensors, tmp_path / "w.bin")
    for name in ("w.safetensors", "w.bin"):
        loaded = load_state_dict(str(tmp_path / name), device_map={"a": "cpu", "b": "disk"})  # "c": unmapped
        assert list(loaded) == list(tensors)
        for key, tensor in tensors.items():
            assert loaded[key].dtype == tensor.dtype and loaded[key].device.type == "cpu"
            assert torch.equal(loaded[key], tensor)
    save_file(tensors, tmp_path / "tf.safetensors", metadata={"format": "tf"})
    with pytest.raises(ValueError, match="format 'tf', not 'pt'"):
        load_state_dict(tmp_path / "tf.safetensors")
    torch.save({"w": torch.ones(1), "code": object()}, tmp_path / "unsafe.bin")
    with pytest.raises(pickle.UnpicklingError):  # weights_only: no arbitrary objects
        load_state_dict(tmp_path / "unsafe.bin")
    with pytest.raises(FileNotFoundError, match="no weights file"):
        load_state_dict(tmp_path / "missing.safetensors")


# ---------------------------------------------------------------- full_state_dict / broadcast_from_rank0

def test_broadcast_from_rank0_needs_a_process_group_and_full_state_dict_on_plain_models(tmp_path):
    model = nn.Linear(3, 3)
    write_model_files(model.state_dict(), tmp_path)
    with pytest.raises(ValueError, match="broadcast_from_rank0=True needs an initialized torch.distributed"):
        load_checkpoint_in_model(nn.Linear(3, 3), tmp_path, broadcast_from_rank0=True)
    with pytest.raises(ValueError, match="needs an initialized"):
        load_checkpoint_and_dispatch(nn.Linear(3, 3), tmp_path, broadcast_from_rank0=True)
    with init_empty_weights():
        empty = nn.Linear(3, 3)
    # a plain model's state dict is full and sharded alike: False loads it the same way
    load_checkpoint_and_dispatch(empty, tmp_path, device_map={"": "cpu"}, full_state_dict=False)
    assert torch.equal(empty.weight, model.weight)


def _source_model() -> nn.Sequential:  # the same weights in the test and in each rank (same seed)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    model[1].bias.data = model[1].bias.data.to(torch.bfloat16)  # any dtype crosses gloo, as bytes
    return model


_BROADCAST = """
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
sys.path.insert(0, {tests!r})
from test_big_model_helpers import _source_model
from hasten.big_modeling.dispatch import init_empty_weights
from hasten.big_modeling.loading import load_checkpoint_in_model

rank, folder = int(os.environ["RANK"]), {folder!r}
torch.set_num_threads(1)
dist.init_process_group("gloo")
source = _source_model()
checkpoint = os.path.join(folder, "ckpt" if rank == 0 else "not-on-this-rank")
result = {{}}
with init_empty_weights():
    empty = _source_model()
offload = os.path.join(folder, f"offload{{rank}}")
load_checkpoint_in_model(empty, checkpoint, device_map={{"0": "cpu", "1": "disk"}}, offload_folder=offload,
                         broadcast_from_rank0=True, strict=True)
result["mapped"] = torch.equal(empty[0].weight, source[0].weight) and empty[1].weight.is_meta
index = json.load(open(os.path.join(offload, "index.json")))
result["offloaded"] = sorted(index), index["1.bias"]["dtype"]

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
sharded = _source_model()
sharded[0].weight = nn.Parameter(distribute_tensor(torch.zeros(6, 4), init_device_mesh("cpu", (2,)), [Shard(0)]))
shard_before = sharded[0].weight
load_checkpoint_in_model(sharded, checkpoint, broadcast_from_rank0=True)
result["dtensor"] = (sharded[0].weight is shard_before and tuple(sharded[0].weight.to_local().shape) == (3, 4)
                     and torch.equal(sharded[0].weight.full_tensor(), source[0].weight)
                     and torch.equal(sharded[1].bias, source[1].bias))
try:
    load_checkpoint_in_model(sharded, checkpoint, full_state_dict=False)
except ValueError as error:
    result["full_state_dict"] = str(error)
try:  # rank 0 cannot read: every rank learns it, none waits forever
    load_checkpoint_in_model(sharded, os.path.join(folder, "missing"), broadcast_from_rank0=True)
except (FileNotFoundError, RuntimeError) as error:
    result["error"] = type(error).__name__ + ": " + str(error)
with open(os.path.join(sys.argv[1], f"rank{{rank}}.json"), "w") as report:
    json.dump(result, report)
"""


def test_broadcast_from_rank0_on_gloo_reads_on_rank0_only_and_fills_dtensor_shards(tmp_path):
    from conftest import launch_ranks

    write_model_files(_source_model().state_dict(), tmp_path / "ckpt")
    script = tmp_path / "broadcast.py"
    script.write_text(_BROADCAST.format(tests=str(Path(__file__).parent), folder=str(tmp_path)))
    out = tmp_path / "reports"
    out.mkdir()
    # through hasten launch: its worker ends each rank cleanly (a bare gloo process may abort at teardown)
    reports = launch_ranks(script, out)
    for rank, report in reports.items():
        assert report["mapped"], rank
        assert report["offloaded"] == [["1.bias", "1.weight"], "bfloat16"], rank
        assert report["dtensor"], rank
        assert "full_state_dict=False means a state dict of DTensor shards" in report["full_state_dict"]
    assert reports[0]["error"].startswith("FileNotFoundError")
    assert reports[1]["error"].startswith("RuntimeError: rank 0 could not read the checkpoint (FileNotFoundError")


# ---------------------------------------------------------------- set_module_tensor_to_device and small facts

def test_set_module_tensor_to_device_non_blocking_and_clear_cache(monkeypatch):
    from hasten.utils import memory

    calls = []
    monkeypatch.setattr(memory, "clear_device_cache", lambda *a, **k: calls.append(a))
    layer = nn.Linear(2, 2)
    set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(2, 2), non_blocking=True)
    set_module_tensor_to_device(layer, "bias", "meta", clear_cache=True)
    assert torch.equal(layer.weight, torch.ones(2, 2)) and layer.bias.is_meta
    assert calls == []  # only an accelerator's cache is emptied


def test_non_persistent_buffers_and_small_facts():
    model = make_model(blocks=2)
    model.register_buffer("root_cache", torch.zeros(1), persistent=False)
    assert get_non_persistent_buffers(model) == {"root_cache"}
    assert get_non_persistent_buffers(model, recurse=True) == {"root_cache", "scratch"}
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"root_cache", "0.scratch", "1.scratch"}
    assert "0.scratch" not in model.state_dict()

    assert check_device_same(torch.device("cpu"), torch.device("cpu", 0))
    assert check_device_same(torch.device("cuda"), torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0))
    assert not check_device_same(torch.device("cuda", 0), torch.device("cuda", 1))
    base = torch.zeros(4)
    assert id_tensor_storage(base[1:]) == id_tensor_storage(base) != id_tensor_storage(base.clone())
    assert not is_peft_model(model)

    tensors = [*model.parameters(), *model.buffers()]  # non-persistent buffers take memory too
    total, (largest, names) = calculate_maximum_sizes(model)
    assert total == sum(t.numel() * t.element_size() for t in tensors)
    assert (largest, names) == ((8 * 8 + 8) * 4, ["0.linear", "1.linear"])  # the Linears are the largest leaves
    model._no_split_modules = ["Block"]
    assert calculate_maximum_sizes(model)[1] == ((total - 4) // 2, ["0", "1"])  # 4: the root's own buffer
    assert get_module_leaves({"": 1, "0": 1, "0.a": 1, "1": 0}) == ["0.a", "1"]

    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(100, 100), nn.Linear(2, 2))
    net[2].weight = net[0].weight
    from hasten.big_modeling.sizes import compute_module_sizes, find_tied_parameters
    sizes = compute_module_sizes(net)
    queue = list(net.named_children())
    assert get_module_size_with_ties(["2.weight"], sizes["0"], sizes, queue[1:]) == (sizes["0"] + sizes["2"], ["2"], [net[2]])
    name, block, rest = fallback_allocate(queue, sizes, sizes["0"] + sizes["2"], tied_parameters=find_tied_parameters(net))
    assert name == "0" and block is net[0] and [n for n, _ in rest] == ["1", "2"]
    assert fallback_allocate(queue[1:2], sizes, 10) == (None, None, queue[1:2])
    with pytest.raises(ValueError, match="size_limit='lots' is not a size"):
        fallback_allocate(queue, sizes, "lots")


def test_tied_parameters_in_config_of_a_transformers_style_model():
    class Config:
        tie_word_embeddings = True

    class PreTrainedModel(nn.Module):  # what the check looks for, without importing transformers
        def __init__(self) -> None:
            super().__init__()
            self.config, self.head = Config(), nn.Linear(2, 2)

        def get_output_embeddings(self):
            return self.head

    assert check_tied_parameters_in_config(PreTrainedModel())
    assert not check_tied_parameters_in_config(nn.Linear(2, 2))


def test_mixed_precision_context_manager_and_grad_scaler():
    from hasten import Accelerator
    from hasten.options import AutocastKwargs
    from hasten.state import AcceleratorState

    with get_mixed_precision_context_manager(native_amp=False):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    Accelerator(cpu=True, mixed_precision="bf16")
    try:
        with get_mixed_precision_context_manager(native_amp=True):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        with get_mixed_precision_context_manager(native_amp=True, autocast_kwargs=AutocastKwargs(enabled=False)):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    finally:
        AcceleratorState._reset_state()
    scaler = get_grad_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert isinstance(get_grad_scaler("FSDP", device="cpu"), ShardedGradScaler)


def test_gpu_and_cpu_weights_come_from_the_mapping_and_disk_bound_ones_are_private(tmp_path):
    """A GPU-bound tensor is a view of the file's mapping (one copy, to the GPU); a CPU-bound one a view of a mapping
    of its own that the model keeps (no copy at load, as Accelerate's); a disk-bound one is read into memory of its own."""
    from safetensors.torch import save_file

    from hasten.big_modeling import loading

    weights = {"gpu.weight": torch.randn(64, 64), "cpu.weight": torch.randn(64, 64), "disk.weight": torch.randn(64, 64)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    asked = []

    def private(name):
        asked.append(name)
        return name.startswith("disk")

    read = dict(loading.read_safetensors(tmp_path / "model.safetensors", private, keep=lambda n: n.startswith("cpu")))
    assert sorted(asked) == sorted(weights)
    assert all(torch.equal(read[name], weights[name]) for name in weights)
    read["cpu.weight"].add_(1)  # a kept view is copy-on-write: the model may train it, the file stays as it was
    assert torch.equal(dict(loading.read_safetensors(tmp_path / "model.safetensors"))["cpu.weight"], weights["cpu.weight"])
    # the device map decides: an int or "cuda:N" device is a GPU (mapped), cpu is kept mapped, disk and meta are private
    model = torch.nn.Module()
    model.gpu, model.cpu = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False)
    model.disk = torch.nn.Linear(64, 64, bias=False)
    seen = {}
    original = loading.read_safetensors

    def spy(file, private=None, raw=None, keep=None):
        seen.update({name: (private(name), keep(name)) for name in weights})
        yield from original(file, private, raw, keep)

    loading.read_safetensors = spy
    try:
        try:  # without a GPU, placing on device 0 fails after the reading decided; with one it loads
            loading.load_checkpoint_in_model(model, str(tmp_path), device_map={"gpu": 0, "cpu": "cpu", "disk": "disk"},
                                             offload_folder=str(tmp_path / "offload"))
        except (RuntimeError, AssertionError, ValueError):
            assert not torch.cuda.is_available()
    finally:
        loading.read_safetensors = original
    assert seen == {"gpu.weight": (False, False), "cpu.weight": (False, True), "disk.weight": (True, False)}
