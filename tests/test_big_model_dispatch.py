"""Big-model dispatch: empty init, forward hooks, CPU/disk offload, load_checkpoint_and_dispatch, peak memory."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import run_with_timeout
from torch import nn

from hasten.big_modeling import hooks as hooks_module
from hasten.big_modeling.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from hasten.big_modeling.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from hasten.checkpointing.model_files import write_model_files
from hasten.utils import recursively_apply

META = torch.device("meta")


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x):
        return torch.relu(self.norm(self.linear(x)))


def make_model(seed: int = 0, blocks: int = 4, width: int = 16) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(*[Block(width) for _ in range(blocks)]).eval()
    for module in model.modules():  # non-trivial running statistics, so buffers matter for the output
        if isinstance(module, nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    return model


# ---------------------------------------------------------------- empty init


def test_init_empty_weights_puts_parameters_on_meta_and_restores_module():
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer
    with init_empty_weights():
        model = nn.Sequential(Block(), Block())
    assert all(p.device == META for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    assert nn.Module.register_parameter is register_parameter and nn.Module.register_buffer is register_buffer
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_init_empty_weights_keeps_weights_tied_in_init():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    with init_empty_weights():
        model = Tied()
    assert model.head.weight is model.embed.weight and model.head.weight.device == META


def test_init_empty_weights_include_buffers(monkeypatch):
    with init_empty_weights(include_buffers=True):
        model = Block()
    assert all(t.device == META for t in [*model.parameters(), *model.buffers()])
    monkeypatch.setenv("HASTEN_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        model = Block()
    assert all(b.device == META for b in model.buffers())
    assert Block().norm.running_mean.device.type == "cpu"


def test_init_empty_weights_restores_module_after_an_error():
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer
    with pytest.raises(RuntimeError, match="boom"), init_empty_weights(include_buffers=True):
        nn.Linear(2, 2)
        raise RuntimeError("boom")
    assert nn.Module.register_parameter is register_parameter and nn.Module.register_buffer is register_buffer
    assert Block().linear.weight.device.type == "cpu"


def test_init_on_device_cpu():
    with init_on_device("cpu"):
        layer = nn.Linear(2, 2)
    assert layer.weight.device.type == "cpu"


# ---------------------------------------------------------------- hooks


def test_add_and_remove_hook_restores_forward_exactly():
    layer = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    expected = layer(x)
    add_hook_to_module(layer, ModelHook())
    assert "forward" in layer.__dict__ and hasattr(layer, "_old_forward") and hasattr(layer, "_hf_hook")
    assert torch.equal(layer(x), expected)
    remove_hook_from_module(layer)
    assert "forward" not in layer.__dict__ and not hasattr(layer, "_old_forward") and not hasattr(layer, "_hf_hook")
    assert layer.forward.__func__ is nn.Linear.forward

    def custom(inputs):  # an instance-level forward set by the user comes back as that same object
        return inputs + 1

    layer.forward = custom
    add_hook_to_module(layer, ModelHook())
    assert torch.equal(layer(x), x + 1)
    remove_hook_from_module(layer)
    assert layer.forward is custom


def test_sequential_hook_order_and_append():
    calls = []

    class Tag(ModelHook):
        def __init__(self, name, op):
            self.name, self.op = name, op

        def pre_forward(self, module, x):
            calls.append(("pre", self.name))
            return (self.op(x),), {}

        def post_forward(self, module, output):
            calls.append(("post", self.name))
            return self.op(output)

    module = nn.Identity()
    add_hook_to_module(module, Tag("a", lambda t: t + 1))
    add_hook_to_module(module, Tag("b", lambda t: t * 2), append=True)
    assert isinstance(module._hf_hook, SequentialHook)
    out = module(torch.tensor([1.0]))
    assert calls == [("pre", "a"), ("pre", "b"), ("post", "a"), ("post", "b")]
    assert out.item() == (((1 + 1) * 2) + 1) * 2
    add_hook_to_module(module, Tag("c", lambda t: t))  # without append it replaces
    assert isinstance(module._hf_hook, Tag)
    remove_hook_from_module(module)
    assert module(torch.tensor([1.0])).item() == 1.0


def test_no_grad_hook():
    class NoGrad(ModelHook):
        no_grad = True

    layer = add_hook_to_module(nn.Linear(2, 2), NoGrad())
    assert not layer(torch.ones(2)).requires_grad
    assert add_hook_to_module(nn.Linear(2, 2), ModelHook())(torch.ones(2)).requires_grad


def test_io_same_device_returns_output_on_the_input_device(monkeypatch):
    # One real device on CPU runners: "meta" plays the execution device; moving off meta makes an empty tensor.
    def send(data, device, non_blocking=False, skip_keys=None):
        return recursively_apply(lambda t: torch.zeros(t.shape, device=device) if t.is_meta else t.to(device), data)

    monkeypatch.setattr(hooks_module, "send_to_device", send)
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(x.device)
            return x * 2

    x = torch.ones(3)
    same = add_hook_to_module(Probe(), AlignDevicesHook(execution_device="meta", io_same_device=True))
    assert same(x).device.type == "cpu" and seen[-1] == META
    other = add_hook_to_module(Probe(), AlignDevicesHook(execution_device="meta"))
    assert other(x).device == META


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_io_same_device_on_gpu():
    layer = add_hook_to_module(nn.Linear(2, 2), AlignDevicesHook("cuda:0", io_same_device=True))
    assert layer.weight.device.type == "cuda" and layer(torch.ones(2)).device.type == "cpu"


def test_align_devices_hook_offload_keeps_weights_on_meta_between_calls():
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    expected = layer(x)
    weights = {k: v.clone() for k, v in layer.state_dict().items()}
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True, weights_map=weights))
    assert layer.weight.device == META
    assert torch.equal(layer(x), expected)
    assert layer.weight.device == META and layer.bias.device == META
    remove_hook_from_module(layer)  # detaching brings the weights back where they started
    assert layer.weight.device.type == "cpu" and torch.equal(layer(x), expected)


# ---------------------------------------------------------------- offload


def test_cpu_offload_matches_original():
    model = make_model()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    cpu_offload(model, execution_device="cpu")
    assert all(p.device == META for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    assert all(p.device == META for p in model.parameters())
    remove_hook_from_submodules(model)
    remove_hook_from_module(model)
    assert "forward" not in model.__dict__


def test_cpu_offload_with_hook():
    model = make_model()
    x = torch.randn(5, 16)
    expected = model(x)
    model, hook = cpu_offload_with_hook(model, execution_device="cpu")
    assert torch.equal(model(x), expected)
    hook.offload()
    hook.remove()
    assert not hasattr(model, "_hf_hook")


def test_disk_offload_matches_original(tmp_path):
    model = make_model()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    disk_offload(model, tmp_path / "offload", execution_device="cpu", offload_buffers=True)
    assert (tmp_path / "offload" / "index.json").is_file()
    assert len(list((tmp_path / "offload").glob("*.dat"))) == len(make_model().state_dict())
    assert all(t.device == META for t in [*model.parameters(), *model.buffers()])
    with torch.no_grad():
        assert torch.equal(model(x), expected)
        assert torch.equal(model(x), expected)
    assert all(p.device == META for p in model.parameters())


def _mapped_files() -> list[str]:
    return [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(".dat")]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_disk_offloaded_weight_is_used_from_the_mapping_without_copy(tmp_path):
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(64, 64))

        def forward(self, x):
            address = self.weight.data_ptr()
            for line in Path("/proc/self/maps").read_text().splitlines():
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                if start <= address < end:
                    seen.append(line.split()[-1])
            return x @ self.weight

    probe = Probe()
    x = torch.randn(2, 64)
    expected = probe(x)
    seen.clear()
    disk_offload(probe, tmp_path / "offload", execution_device="cpu")
    assert torch.equal(probe(x), expected)
    assert seen == [str(tmp_path / "offload" / "weight.dat")]  # the weight's memory is the file's mapping
    assert not any(str(tmp_path) in name for name in _mapped_files())  # and it is unmapped after the forward


def test_disk_offload_never_writes_into_the_read_only_mapping(tmp_path):
    # In a subprocess: a write into a read-only mapping would kill the process (SIGSEGV), not raise.
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        from hasten.big_modeling.dispatch import disk_offload
        from hasten.big_modeling.hooks import remove_hook_from_module
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
        disk_offload(model, {str(tmp_path / "offload")!r}, execution_device="cpu", offload_buffers=True)
        model(torch.randn(3, 4))  # BatchNorm updates its running statistics in place
        remove_hook_from_module(model, recurse=True)
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.add_(1)  # detached weights are private, writable memory again
        print("ok")
    """)
    result = run_with_timeout([sys.executable, "-c", script], 120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_dispatch_model_with_tied_weights_across_cpu_and_disk(tmp_path):
    model = make_model()
    model[3].linear.weight = model[0].linear.weight
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    dispatch_model(model, {"0": "cpu", "1": "disk", "2": "cpu", "3": "disk"}, offload_dir=tmp_path / "offload")
    with torch.no_grad():
        assert torch.equal(model(x), expected)
        assert torch.equal(model(x), expected)


def test_dispatch_model_with_disk_blocks(tmp_path):
    model = make_model()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    device_map = {"0": "cpu", "1": "disk", "2": "cpu", "3": "disk"}
    dispatch_model(model, device_map, offload_dir=tmp_path / "offload")
    assert model.hf_device_map == device_map
    assert model[0].linear.weight.device.type == "cpu" and model[1].linear.weight.device == META
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    assert model[3].linear.weight.device == META
    with pytest.raises(RuntimeError, match="offloaded"):
        model.to("cpu")


def test_dispatch_model_maps_the_whole_model_to_disk(tmp_path):
    """{"": "disk"} (what "auto" infers when nothing fits in memory) is hooked and streams from the folder."""
    model = make_model()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    dispatch_model(model, {"": "disk"}, offload_dir=tmp_path / "offload")
    assert model.hf_device_map == {"": "disk"} and all(p.device == META for p in model.parameters())
    assert (tmp_path / "offload" / "index.json").is_file() and (tmp_path / "offload" / "0.linear.weight.dat").is_file()
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    assert all(p.device == META for p in model.parameters())


def test_dispatch_model_refuses_disk_without_offload_dir():
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(make_model(), {"0": "cpu", "1": "disk", "2": "cpu", "3": "cpu"})


def test_load_checkpoint_and_dispatch_rejects_unknown_device_map_string(tmp_path):
    with pytest.raises(ValueError, match="'auto', 'balanced', 'balanced_low_0', 'sequential'"):
        load_checkpoint_and_dispatch(make_model(), tmp_path, device_map="fastest")


# ---------------------------------------------------------------- checkpoint + dispatch


@pytest.mark.parametrize("device_map", ["sequential", "balanced", {"0": "cpu", "1": "disk", "2": "disk", "3": "cpu"}, None])
def test_load_checkpoint_and_dispatch_device_map_kinds(tmp_path, device_map):
    reference = make_model()
    write_model_files(reference.state_dict(), tmp_path / "checkpoint")
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = reference(x)
    with init_empty_weights():
        model = make_model().eval()
    block = sum(t.numel() * t.element_size() for t in reference[0].state_dict().values())
    model = load_checkpoint_and_dispatch(model, tmp_path / "checkpoint", device_map=device_map,
                                         max_memory={"cpu": 2 * block + block // 2}, offload_folder=tmp_path / "offload")
    if device_map is None:
        assert not hasattr(model, "hf_device_map") and all(p.device.type == "cpu" for p in model.parameters())
    else:
        assert "disk" in model.hf_device_map.values()
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_load_checkpoint_and_dispatch_tiny_bert(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=2000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    reference = transformers.BertModel(config).eval()
    checkpoint = tmp_path / "checkpoint"
    files = write_model_files(reference.state_dict(), checkpoint, max_shard_size="1MB")
    assert any(name.endswith(".index.json") for name in files) and len(files) > 2
    ids = torch.randint(0, 2000, (2, 12))
    with torch.no_grad():
        expected = reference(input_ids=ids).last_hidden_state
    total = sum(t.numel() * t.element_size() for t in reference.state_dict().values())

    with init_empty_weights():
        model = transformers.BertModel(config).eval()
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory={"cpu": total // 2},
                                         no_split_module_classes=["BertLayer"], offload_folder=offload)
    disk = [name for name, device in model.hf_device_map.items() if device == "disk"]
    assert disk and "cpu" in model.hf_device_map.values()
    assert (offload / "index.json").is_file() and list(offload.glob("*.dat"))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state, expected)
    # Disk blocks are back on meta after the forward: nothing of theirs stays resident.
    for name in disk:
        assert all(p.device == META for p in model.get_submodule(name).parameters())
    resident = {n for n, p in model.named_parameters() if p.device.type == "cpu"}
    assert resident and all(not any(n.startswith(d + ".") for d in disk) for n in resident)


# ---------------------------------------------------------------- peak memory

# 8 blocks of 2048x2048 fp32 (16 MiB each): 128 MiB of weights.
_MODEL = """
import torch
from torch import nn

def memory_model():
    return nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(8)])
"""

_PREPARE = _MODEL + """
from hasten.checkpointing.model_files import write_model_files
torch.set_num_threads(1)
torch.manual_seed(0)
model = memory_model()
write_model_files(model.state_dict(), {checkpoint!r}, max_shard_size="16MB")
x = torch.randn(4, 2048)
with torch.no_grad():
    torch.save({{"x": x, "y": model(x)}}, {reference!r})
"""

_MEASURE = _MODEL + """
import ctypes, gc, json
from hasten.big_modeling.dispatch import init_empty_weights, load_checkpoint_and_dispatch
torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")

def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

reference = torch.load({reference!r})
x = reference["x"]
with torch.no_grad():  # warm up torch's kernels and thread pool outside the measured window
    torch.nn.functional.linear(x, torch.zeros(8, 2048))
with init_empty_weights():
    model = memory_model()
gc.collect(); libc.malloc_trim(0)
open("/proc/self/clear_refs", "w").write("5")
baseline = status("VmRSS")
model = load_checkpoint_and_dispatch(model, {checkpoint!r}, device_map="auto", max_memory={{"cpu": "40MB"}},
                                     offload_folder={offload!r})
# The CPU weights are views of the checkpoint's mapping (as Accelerate's): touch them, so that they count as what
# loading left resident and the forwards below measure only what offloading adds.
touched = sum(float(p.sum()) for p in model.parameters() if p.device.type == "cpu")
after_load = status("VmHWM")
gc.collect(); libc.malloc_trim(0)
before_forward = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the forward's own peak, on top of what loading left resident
with torch.no_grad():
    y = model(x)
peak = max(status("VmHWM"), after_load)
forward_growth = status("VmHWM") - before_forward
equal = bool(torch.equal(y, reference["y"]))
del y; gc.collect(); libc.malloc_trim(0)  # count live memory, not what glibc keeps cached
resident = status("VmRSS")  # after the forward: offloaded blocks are unmapped again
open("/proc/self/clear_refs", "w").write("5")  # the second forward reads each next block ahead, on a thread
with torch.no_grad():
    equal = equal and bool(torch.equal(model(x), reference["y"]))
second_growth = status("VmHWM") - before_forward
gc.collect(); libc.malloc_trim(0)
resident_after_second = status("VmRSS")
print(json.dumps({{"baseline": baseline, "load_growth": after_load - baseline, "growth": peak - baseline,
                  "forward_growth": forward_growth, "second_growth": second_growth,
                  "resident_after_second": resident_after_second - baseline,
                  "resident_growth": resident - baseline,
                  "equal": equal, "device_map": model.hf_device_map}}))
"""

MiB = 1024 * 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc peak-RSS reset")
def test_peak_memory_of_offloaded_forward_stays_within_budget(tmp_path):
    paths = {"checkpoint": str(tmp_path / "ckpt"),
             "reference": str(tmp_path / "reference.pt"), "offload": str(tmp_path / "offload")}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, source in (("prepare", _PREPARE), ("measure", _MEASURE)):
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(source.format(**paths)))
        result = run_with_timeout([sys.executable, str(script)], 120, env)
        assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print("peak-RSS report:", report)
    budget, largest_block, slack = 40 * 10**6, (2048 * 2048 + 2048) * 4, 40 * MiB
    assert report["equal"], "offloaded outputs differ from the fully loaded model's"
    assert "disk" in report["device_map"].values()
    # A forward maps one disk block at a time and uses it in place (a copy would double this).
    assert report["forward_growth"] <= largest_block + 8 * MiB, f"forward added {report['forward_growth'] / MiB:.1f} MiB"
    # Later forwards read one block ahead while the current one computes: at most one more block.
    assert report["second_growth"] <= 2 * largest_block + 8 * MiB, f"forward added {report['second_growth'] / MiB:.1f} MiB"
    assert report["resident_after_second"] <= 40 * 10**6 + 8 * MiB, "a block read ahead stayed mapped after the forward"
    # After the forward only the CPU-mapped blocks stay resident: the disk blocks' mappings are gone.
    assert report["resident_growth"] <= 40 * 10**6 + 8 * MiB, f"{report['resident_growth'] / MiB:.1f} MiB still resident"
    assert report["growth"] <= budget + largest_block + slack, (
        f"peak RSS grew by {report['growth'] / MiB:.1f} MiB, over {(budget + largest_block + slack) / MiB:.1f} MiB")


def _disk_offloaded_linears(tmp_path, layers: int, rows: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """`layers` Linear(8, 8) offloaded to disk, an input of `rows` rows, and the output before offloading."""
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    x = torch.randn(rows, 8)
    with torch.no_grad():
        expected = model(x)
    disk_offload(model, tmp_path / "offload", execution_device="cpu")
    return model, x, expected


def test_later_forwards_read_the_next_disk_block_on_a_thread_while_the_current_one_runs(tmp_path, monkeypatch):
    from hasten.big_modeling.offload import OffloadedWeightsLoader

    reads: list[tuple[str, str]] = []
    read = OffloadedWeightsLoader._read

    def recording(self, key):
        import threading

        reads.append((key, threading.current_thread().name))
        return read(self, key)

    monkeypatch.setattr(OffloadedWeightsLoader, "_read", recording)
    model, x, expected = _disk_offloaded_linears(tmp_path, layers=4, rows=3)
    with torch.no_grad():
        first = model(x)
        reads.clear()
        second = model(x)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    ahead = sorted(key for key, thread in reads if thread.startswith("hasten-offload-prefetch"))
    # Only the first layer is read in line; layers 1-3 were read while the one before them ran.
    assert ahead == [f"{i}.{kind}" for i in (1, 2, 3) for kind in ("bias", "weight")], reads
    assert sorted(key for key, thread in reads if key not in ahead) == ["0.bias", "0.weight"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_a_disk_offloaded_model_its_parent_ran(tmp_path):
    # The parent's read-ahead thread does not exist in a forked child (notebook_launcher forks): the child must not
    # wait for it.
    model, x, expected = _disk_offloaded_linears(tmp_path, layers=3, rows=2)
    with torch.no_grad():
        model(x), model(x)  # the order is learnt; the thread is started
    pid = os.fork()
    if pid == 0:
        ok = False  # an exception in the child must still end it here, not run pytest on in a second process
        try:
            with torch.no_grad():
                ok = torch.equal(model(x), expected) and torch.equal(model(x), expected)
        finally:
            os._exit(0 if ok else 3)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on its parent's read-ahead thread")
    assert os.waitstatus_to_exitcode(done[1]) == 0
