"""Big-model planning and loading: sizes, device maps, disk offload, lazy checkpoint loading (CPU only, fast)."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from hasten.big_modeling.device_map import (
    check_device_map,
    clean_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from hasten.big_modeling.loading import load_checkpoint_in_model
from hasten.big_modeling.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from hasten.big_modeling.sizes import (
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from hasten.checkpointing.model_files import parse_size, write_model_files

FAKE_GPUS = pytest.mark.filterwarnings("ignore:max_memory names GPU")


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x))) * self.scale


class Toy(nn.Module):
    """Embedding tied to the head, no-split blocks with buffers, a norm: the shape of a small language model."""

    def __init__(self, vocab: int = 50, d: int = 16, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def toy(seed: int = 0, **kwargs) -> Toy:
    torch.manual_seed(seed)
    model = Toy(**kwargs)
    with torch.no_grad():  # make the norm non-trivial so a wrong load shows in the outputs
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    return model


def real_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for _, t in named_module_tensors(model, recurse=True))


def device_of(name: str, device_map) -> object:
    while name not in device_map:
        name = name.rpartition(".")[0]
    return device_map[name]


def bert(meta: bool = False):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    if meta:
        with torch.device("meta"):
            return transformers.BertModel(config)
    return transformers.BertModel(config)


# ---------------------------------------------------------------- sizes

@pytest.mark.parametrize("text, expected", [
    ("60MB", 60 * 10**6), ("2GiB", 2 * 2**30), ("500kb", 500_000), ("1.5GB", 1_500_000_000), ("2.3MB", 2_300_000),
    ("10 MiB", 10 * 2**20), ("1000", 1000), ("7B", 7), (12345, 12345), (0, 0),
])
def test_memory_strings(text, expected):
    assert convert_file_size_to_int(text) == expected


@pytest.mark.parametrize("bad", ["ten", "5 parsecs", "", "MB", "-1GB", "1.2.3GB", -5, None, True, [1]])
def test_bad_memory_strings_say_what_is_wrong(bad):
    with pytest.raises(ValueError, match=r"size=.* is not a size; write .* like 60MB, 2GiB"):
        convert_file_size_to_int(bad)


def test_parse_size_is_the_same_parser_with_its_own_name():
    assert parse_size("17KB") == convert_file_size_to_int("17KB") == 17_000
    with pytest.raises(ValueError, match="max_shard_size='ten' is not a size"):
        parse_size("ten")


def test_dtype_byte_size():
    assert dtype_byte_size(torch.float32) == 4 and dtype_byte_size(torch.bfloat16) == 2
    assert dtype_byte_size(torch.bool) == 1 / 8 and dtype_byte_size(torch.int64) == 8
    assert dtype_byte_size("int8") == 1 and dtype_byte_size("int4") == 0.5 and dtype_byte_size("float16") == 2
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_byte_size("float17")


def test_compute_module_sizes_is_the_real_byte_count_on_bert_and_on_meta():
    model, empty = bert(), bert(meta=True)
    sizes = compute_module_sizes(model)
    assert sizes[""] == real_bytes(model)
    assert sizes["encoder.layer.0"] == real_bytes(model.encoder.layer[0])
    assert sizes["embeddings.word_embeddings.weight"] == 100 * 32 * 4
    assert dict(compute_module_sizes(empty)) == dict(sizes)
    half = compute_module_sizes(empty, dtype="float16")
    ints = sum(b.numel() * 8 for _, b in model.named_buffers())  # position/token type ids: never cast, so full size
    assert half[""] == (sizes[""] - ints) // 2 + ints
    assert compute_module_sizes(model, special_dtypes={"pooler.dense.weight": torch.int8})["pooler"] == 32 * 32 + 32 * 4
    assert compute_module_total_buffer_size(model) == ints
    assert compute_module_sizes(Toy())["head"] == 0  # tied to embed.weight: counted once, under its first name


def test_get_max_layer_size_respects_no_split_classes():
    model = bert(meta=True)
    sizes = compute_module_sizes(model)
    top = list(model.named_children())
    assert get_max_layer_size(top, sizes, ["BertLayer"]) == (sizes["encoder.layer.0"], ["encoder.layer.0", "encoder.layer.1"])
    largest, names = get_max_layer_size(top, sizes, [])
    assert names == ["embeddings.word_embeddings"] and largest == sizes["embeddings.word_embeddings"] < sizes["encoder.layer.0"]


def test_tied_parameters_found_on_meta_checked_and_retied(caplog):
    with torch.device("meta"):
        model = Toy()
    tied = find_tied_parameters(model)
    assert tied == [["embed.weight", "head.weight"]]
    with caplog.at_level(logging.WARNING):
        check_tied_parameters_on_same_device(tied, {"embed": "cpu", "head": "disk", "": "cpu"})
    assert "Tied parameters are on different devices" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_tied_parameters_on_same_device(tied, {"": "cpu"})
    assert not caplog.text
    model.head.weight = nn.Parameter(torch.zeros(50, 16))  # untied, as a loader that replaces names leaves it
    retie_parameters(model, tied)
    assert model.embed.weight is model.head.weight and not model.embed.weight.is_meta


def test_get_max_memory(caplog):
    found = get_max_memory()
    assert isinstance(found["cpu"], int) and found["cpu"] > 0
    with caplog.at_level(logging.WARNING):
        budgets = get_max_memory({"disk": "1TB", "cpu": "2GiB", "cuda:1": "1GB", 0: 5})
    assert budgets == {0: 5, 1: 10**9, "cpu": 2 * 2**30, "disk": 10**12} and list(budgets) == [0, 1, "cpu", "disk"]
    assert "max_memory names GPU(s)" in caplog.text or torch.cuda.device_count() >= 2  # a log line, not a warning
    with pytest.raises(ValueError, match="'tpu' that is not a device"):
        get_max_memory({"tpu": 1})
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\]='lots' is not a size"):
        get_max_memory({"cpu": "lots"})


def test_set_module_tensor_to_device_from_meta():
    with torch.device("meta"):
        layer = nn.Linear(2, 3)
    layer.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="on the meta device.*pass `value`"):
        set_module_tensor_to_device(layer, "weight", "cpu")
    set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(3, 2, dtype=torch.float64))
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.dtype == torch.float32 and not layer.weight.requires_grad
    set_module_tensor_to_device(layer, "bias", "cpu", value=torch.ones(3), dtype="bfloat16")
    assert layer.bias.dtype == torch.bfloat16 and layer.bias.requires_grad
    with pytest.raises(ValueError, match=r'shape torch.Size\(\[2, 2\]\) in "weight" \(which has shape torch.Size\(\[3, 2\]\)\), this looks incorrect'):
        set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(2, 2))
    shared, twins = torch.ones(3, 2), nn.ModuleList([nn.Linear(2, 3), nn.Linear(2, 3)]).to("meta")
    pointers = {shared.data_ptr(): {}}  # the peer hooks' table: a tied weight is put on a device only once
    for twin in twins:
        set_module_tensor_to_device(twin, "weight", "cpu", value=shared, tied_params_map=pointers)
    assert twins[0].weight is twins[1].weight is pointers[shared.data_ptr()]["cpu"]
    norm = nn.BatchNorm1d(2)
    set_module_tensor_to_device(norm, "num_batches_tracked", "meta", dtype=torch.float16)  # integers are never cast
    assert norm.num_batches_tracked.is_meta and norm.num_batches_tracked.dtype == torch.int64
    with pytest.raises(ValueError, match="no parameter or buffer named 'nope'"):
        set_module_tensor_to_device(norm, "nope", "cpu")


# ---------------------------------------------------------------- device maps

def assigned_bytes(model, device_map, sizes):
    totals: dict = {}
    for name, device in device_map.items():
        totals[device] = totals.get(device, 0) + sizes[name]
    assert sum(totals.values()) == sizes[""]  # every byte placed exactly once
    return totals


@FAKE_GPUS
def test_infer_auto_device_map_fills_gpus_cpu_then_disk_within_limits():
    model = toy(n=6)
    sizes = compute_module_sizes(model)
    budgets = {0: 9000, 1: 9000, "cpu": 9000}
    device_map = infer_auto_device_map(model, budgets, no_split_module_classes=["Block"])
    assert [device_map[f"blocks.{i}"] for i in range(6)] == [1, 1, "cpu", "disk", "disk", "disk"]
    check_device_map(model, device_map)
    assert list(dict.fromkeys(device_map.values())) == [0, 1, "cpu", "disk"]  # devices in order, each used once
    reserve = sizes["blocks.0"]  # the largest no-split block: kept free on GPU 0 and the CPU for offloaded blocks
    totals = assigned_bytes(model, device_map, sizes)
    assert totals[0] + reserve <= 9000 and totals[1] <= 9000 and totals["cpu"] + reserve <= 9000 and totals["disk"] > 0
    assert not any(name.count(".") > 1 for name in device_map)  # no Block was cut into its layers
    assert device_of("embed", device_map) == device_of("head", device_map) == 0  # tied weights stay together


def test_infer_auto_device_map_spills_cpu_to_disk_for_a_meta_model():
    with torch.device("meta"):
        model = Toy(vocab=1000, d=512, n=20)  # about 86 MB, never allocated
    device_map = infer_auto_device_map(model, max_memory={"cpu": "60MB"}, no_split_module_classes=["Block"])
    devices = list(device_map.values())
    assert set(devices) == {"cpu", "disk"} and devices == sorted(devices)  # all "cpu" entries come before "disk"
    sizes = compute_module_sizes(model)
    assert assigned_bytes(model, device_map, sizes)["cpu"] + sizes["blocks.0"] <= 60 * 10**6
    assert all(name.count(".") <= 1 for name in device_map)
    assert device_of("head", device_map) == device_of("embed", device_map) == "cpu"
    assert dict(infer_auto_device_map(Toy())) == {"": "cpu"}  # no budget given: this machine's RAM, plenty
    with pytest.raises(ValueError, match=r"'embed' needs 2048000 bytes and fits on no device of max_memory \(cpu: 1000000, disk: 1000000"):
        infer_auto_device_map(model, max_memory={"cpu": "1MB", "disk": "1MB"}, no_split_module_classes=["Block"])


def test_infer_auto_device_map_on_bert_never_splits_bert_layers():
    model = bert(meta=True)
    sizes = compute_module_sizes(model)
    device_map = infer_auto_device_map(model, {"cpu": sizes[""] // 2}, no_split_module_classes=["BertLayer"])
    check_device_map(model, device_map)
    assert not any(name.startswith(("encoder.layer.0.", "encoder.layer.1.")) for name in device_map)
    assert set(device_map.values()) == {"cpu", "disk"}
    unsplit = infer_auto_device_map(model, {"cpu": sizes[""] // 2})
    assert any(name.startswith("encoder.layer.") and name.count(".") > 2 for name in unsplit)


@FAKE_GPUS
def test_fallback_allocation_puts_a_small_module_on_an_otherwise_empty_device():
    model = toy()
    sizes = compute_module_sizes(model)
    budgets = {0: sizes["blocks.0"] + 200, "cpu": 10**6}  # GPU 0 can hold the norm (128 bytes) beside its reserve
    plain = infer_auto_device_map(model, budgets, no_split_module_classes=["Block"])
    assert 0 not in plain.values()
    fallback = infer_auto_device_map(model, budgets, no_split_module_classes=["Block"], fallback_allocation=True)
    assert fallback["norm"] == 0 and set(fallback.values()) == {0, "cpu"}
    check_device_map(model, fallback)


@FAKE_GPUS
def test_get_balanced_memory_spreads_over_gpus():
    model = toy()
    total = compute_module_sizes(model)[""]
    budgets = get_balanced_memory(model, {0: 10**6, 1: 10**6, "cpu": 10**6}, no_split_module_classes=["Block"])
    assert total // 2 <= budgets[0] < total and budgets[1] == 10**6 and budgets["cpu"] == 10**6
    device_map = infer_auto_device_map(model, budgets, no_split_module_classes=["Block"])
    assert set(device_map.values()) == {0, 1}
    low = get_balanced_memory(model, {0: 10**6, 1: 10**6, 2: 10**6}, no_split_module_classes=["Block"], low_zero=True)
    assert low[0] < budgets[0]
    assert get_balanced_memory(model, {"cpu": "1GB"}) == {"cpu": 10**9}  # no GPU: nothing to balance


def test_clean_and_check_device_map():
    from collections import OrderedDict

    raw = OrderedDict([("a", 0), ("b.0", "cpu"), ("b.1.x", "cpu"), ("b.1.y", "cpu"), ("c.0", "disk"), ("c.1", "cpu")])
    assert list(clean_device_map(raw).items()) == [("a", 0), ("b", "cpu"), ("c.0", "disk"), ("c.1", "cpu")]
    assert dict(clean_device_map(OrderedDict([("x.0", "cpu"), ("y", "cpu")]))) == {"": "cpu"}
    model = toy()
    check_device_map(model, {"": "cpu"})
    with pytest.raises(ValueError, match=r"no device to 3 tensor\(s\) of the model: norm.weight, norm.bias, head.weight"):
        check_device_map(model, {"embed": "cpu", "blocks": "cpu"})


# ---------------------------------------------------------------- offload format

def test_offload_roundtrip_is_memory_mapped_and_keeps_dtypes(tmp_path):
    tensors = {"bf": torch.randn(3, 4).to(torch.bfloat16), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
               "mask": torch.tensor([True, False]), "ids": torch.arange(5), "big": torch.randn(256, 256)}
    index: dict = {}
    for name, tensor in tensors.items():
        offload_weight(tensor, name, tmp_path, index=index)
    assert index["bf"] == {"dtype": "bfloat16", "shape": [3, 4]} and index["scalar"]["shape"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" warning is handled, not leaked
        loaded = {name: load_offloaded_weight(tmp_path / f"{name}.dat", index[name]) for name in tensors}
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape
        assert torch.equal(loaded[name], tensor)
    if Path("/proc/self/maps").exists():  # zero copy: the file itself backs the tensor
        assert str(tmp_path / "big.dat") in Path("/proc/self/maps").read_text()
    save_offload_index({"bf": index["bf"]}, tmp_path)
    save_offload_index({"ids": index["ids"]}, tmp_path)  # merges with what is there
    assert sorted(json.loads((tmp_path / "index.json").read_text())) == ["bf", "ids"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_offloaded_weights_loader_prefixed_dataset_and_extract(tmp_path):
    offload_state_dict(tmp_path / "off", {"a.w": torch.ones(2), "a.b": torch.zeros(1)})
    from safetensors.torch import save_file

    save_file({"stored": torch.full((2,), 3.0)}, tmp_path / "w.safetensors")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    index["s.w"] = {"safetensors_file": str(tmp_path / "w.safetensors"), "weight_name": "stored", "dtype": "float16"}
    weights = OffloadedWeightsLoader(state_dict={"m.w": torch.tensor([7.0])}, save_folder=tmp_path / "off", index=index)
    assert list(weights) == ["m.w", "a.w", "a.b", "s.w"] and len(weights) == 4
    assert torch.equal(weights["a.w"], torch.ones(2)) and weights["s.w"].dtype == torch.float16
    assert torch.equal(weights["m.w"], torch.tensor([7.0]))
    view = PrefixedDataset(weights, "a.")
    assert sorted(view) == ["b", "w"] and len(view) == 2 and torch.equal(view["b"], torch.zeros(1))
    assert sorted(extract_submodules_state_dict({"h.1.w": 1, "h.10.w": 2, "h.1": 3, "g": 4}, ["h.1", "g"])) == ["g", "h.1", "h.1.w"]
    with pytest.raises(ValueError, match="needs a state_dict, a save_folder or an index"):
        OffloadedWeightsLoader()


# ---------------------------------------------------------------- load_checkpoint_in_model

DISK_MAP = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu",
            "norm": "disk", "head": "cpu"}


def save_as(kind: str, model: nn.Module, folder: Path) -> Path:
    state = model.state_dict()
    if kind == "single":
        write_model_files(state, folder)
        return folder / "model.safetensors"
    if kind == "sharded":
        names = write_model_files(state, folder, max_shard_size="5KB")
        assert len(names) > 3
        return folder / "model.safetensors.index.json"
    if kind == "folder":
        write_model_files(state, folder, max_shard_size="5KB")
        return folder
    write_model_files(state, folder, safe_serialization=False)
    return folder / "pytorch_model.bin"


@pytest.mark.parametrize("kind", ["single", "sharded", "folder", "torch"])
def test_load_into_meta_model_with_disk_offload_matches_the_original(tmp_path, kind):
    original = toy(seed=1)
    checkpoint = save_as(kind, original, tmp_path / "ckpt")
    with torch.device("meta"):
        model = Toy()
    offload = tmp_path / "offload"
    load_checkpoint_in_model(model, checkpoint, device_map=DISK_MAP, offload_folder=offload, strict=True)
    assert model.blocks[1].fc1.weight.is_meta and model.norm.weight.is_meta  # on disk, not in memory
    assert not model.blocks[1].scale.is_meta  # buffers stay in memory unless offload_buffers
    assert model.blocks[0].fc1.weight.device.type == "cpu" and isinstance(model.blocks[0].fc1.weight, nn.Parameter)
    assert model.head.weight is model.embed.weight
    index = json.loads((offload / "index.json").read_text())
    assert sorted(index) == sorted(n for n in original.state_dict() if n.startswith(("blocks.1.fc", "blocks.2.fc", "norm.")))
    assert all((offload / f"{name}.dat").is_file() for name in index)
    load_offloaded_weights(model, index, offload)
    ids = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(model(ids), original(ids), rtol=0, atol=0)


def test_load_offloads_buffers_casts_dtype_and_keeps_fp32_modules(tmp_path):
    original = toy(seed=2)
    write_model_files(original.state_dict(), tmp_path)
    with torch.device("meta"):
        model = Toy()
    load_checkpoint_in_model(model, tmp_path, device_map=DISK_MAP, offload_folder=tmp_path / "off", dtype="float16",
                             offload_buffers=True, keep_in_fp32_modules=["norm"])
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert index["blocks.1.scale"]["dtype"] == "float16" and index["norm.weight"]["dtype"] == "float32"
    assert model.blocks[0].fc1.weight.dtype == torch.float16 and model.blocks[1].scale.is_meta
    assert model.norm.weight.is_meta and model.norm.weight.dtype == torch.float32
    load_offloaded_weights(model, index, tmp_path / "off")
    assert model.norm.weight.dtype == torch.float32 and model.blocks[2].fc2.bias.dtype == torch.float16
    torch.testing.assert_close(model.blocks[2].fc2.weight, original.blocks[2].fc2.weight.half(), rtol=0, atol=0)


@pytest.mark.parametrize("piece", [None, 1000])
def test_disk_weights_go_file_to_file_byte_for_byte(tmp_path, monkeypatch, piece):
    """A safetensors tensor bound for disk in its own dtype is copied file to file, never through offload_weight."""
    from hasten.big_modeling import loading
    from hasten.big_modeling import offload as offload_module

    original = toy(seed=3)
    original.norm.to(torch.bfloat16)  # a dtype NumPy lacks: its .dat holds the bits, the index names bfloat16
    write_model_files(original.state_dict(), tmp_path / "ckpt")
    with torch.device("meta"):
        model = Toy()
    model.norm.to(torch.bfloat16)

    def refuse(*args, **kwargs):
        raise AssertionError("a disk-bound tensor in its own dtype went through memory")

    monkeypatch.setattr(loading, "offload_weight", refuse)
    if piece:  # a buffer smaller than a tensor: the copy goes round in pieces, same bytes
        monkeypatch.setattr(offload_module, "_PIECE_BYTES", piece)
    load_checkpoint_in_model(model, tmp_path / "ckpt", device_map=DISK_MAP, offload_folder=tmp_path / "off", strict=True)
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert index["norm.weight"] == {"dtype": "bfloat16", "shape": [16]} and len(index) == 10
    for name in index:
        expected = original.state_dict()[name].contiguous().view(torch.uint8).numpy().tobytes()
        assert (tmp_path / "off" / f"{name}.dat").read_bytes() == expected
    load_offloaded_weights(model, index, tmp_path / "off")
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
    shard = tmp_path / "ckpt" / "model.safetensors"  # a file that ends before the tensor does: EOFError, not a short .dat
    with pytest.raises(EOFError, match="ends 8 bytes before the tensor"):
        offload_module.offload_file_range(shard, 0, shard.stat().st_size + 8, torch.uint8, [1], "cut", tmp_path / "off")


def test_load_without_device_map_fills_in_place_or_materialises_meta(tmp_path):
    original = toy(seed=3)
    state = {k: v for k, v in original.state_dict().items() if k != "head.weight"}  # stored once, as HF does for ties
    write_model_files(state, tmp_path)
    target = toy(seed=4)
    weight = target.blocks[0].fc1.weight
    load_checkpoint_in_model(target, tmp_path, strict=True)  # the tied head is not "missing"
    assert target.blocks[0].fc1.weight is weight and torch.equal(weight, original.blocks[0].fc1.weight)
    with torch.device("meta"):
        empty = Toy()
    load_checkpoint_in_model(empty, tmp_path, strict=True)
    assert empty.head.weight is empty.embed.weight and not empty.head.weight.is_meta
    ids = torch.randint(0, 50, (1, 4))
    torch.testing.assert_close(empty(ids), original(ids), rtol=0, atol=0)


def test_mismatched_keys_are_named(tmp_path, caplog):
    state = toy().state_dict()
    del state["norm.bias"]
    state["extra.weight"] = torch.ones(1)
    write_model_files(state, tmp_path)
    with pytest.raises(ValueError, match=r"1 missing key\(s\) \(norm.bias\) and 1 unexpected key\(s\) \(extra.weight\)"):
        load_checkpoint_in_model(toy(), tmp_path, strict=True)
    with caplog.at_level(logging.WARNING):
        load_checkpoint_in_model(toy(), tmp_path, device_map={"": "cpu"})
    assert "norm.bias" in caplog.text and "extra.weight" in caplog.text


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    write_model_files(toy(vocab=50).state_dict(), tmp_path)
    with torch.device("meta"):
        model = Toy(vocab=40)
    with pytest.raises(ValueError, match=r"embed.weight has shape \(50, 16\) in model.safetensors but \(40, 16\) in the model"):
        load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"})


@pytest.mark.parametrize("safe", [True, False])
def test_truncated_file_gives_one_clear_sentence(tmp_path, safe):
    write_model_files(toy().state_dict(), tmp_path, safe_serialization=safe)
    file = tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{file.name} is damaged or truncated .*; re-save the checkpoint or download"):
        load_checkpoint_in_model(toy(), tmp_path)


def test_missing_shard_and_missing_offload_folder_are_named(tmp_path):
    shard = write_model_files(toy().state_dict(), tmp_path, max_shard_size="5KB")[1]
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=rf"shard {shard} listed in "
                                                r"model.safetensors.index.json is missing"):
        load_checkpoint_in_model(toy(), tmp_path)
    with pytest.raises(ValueError, match="sends modules to 'disk' but no offload_folder"):
        load_checkpoint_in_model(toy(), tmp_path, device_map=DISK_MAP)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint_in_model(toy(), tmp_path / "nowhere")


def test_offload_state_dict_parks_cpu_weights_and_cleans_up(tmp_path, monkeypatch):
    original = toy(seed=5)
    write_model_files(original.state_dict(), tmp_path / "ckpt")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with torch.device("meta"):
        model = Toy()
    load_checkpoint_in_model(model, tmp_path / "ckpt", device_map={"": "cpu"}, offload_state_dict=True, strict=True)
    assert list((tmp_path / "tmp").iterdir()) == []  # the staging folder is gone
    assert model.head.weight is model.embed.weight
    ids = torch.randint(0, 50, (1, 3))
    torch.testing.assert_close(model(ids), original(ids), rtol=0, atol=0)


def resident_mb() -> float:
    """This process's live resident memory: garbage collected and glibc's freed heap given back first (a long pytest
    run leaves freed chunks in malloc's arenas, which a copy's free would otherwise seem to keep)."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from Linux /proc")
@pytest.mark.parametrize("safe", [True, False])
def test_loading_with_disk_offload_leaves_the_checkpoint_out_of_memory(tmp_path, safe):
    write_model_files(Toy(vocab=1000, d=512, n=6).state_dict(), tmp_path / "ckpt", safe_serialization=safe)
    with torch.device("meta"):
        model = Toy(vocab=1000, d=512, n=6)  # 27 MB of weights, 2 MB of them the embedding
    before = resident_mb()
    load_checkpoint_in_model(model, tmp_path / "ckpt", device_map={"": "disk", "embed": "cpu", "head": "cpu"},
                             offload_folder=tmp_path / "off")
    # only the CPU part (2 MB) and buffers may stay; file pages read for the disk part must not linger in this process
    assert resident_mb() - before < 8
    assert model.embed.weight.device.type == "cpu" and model.blocks[5].fc2.weight.is_meta
