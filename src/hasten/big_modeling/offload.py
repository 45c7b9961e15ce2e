"""Weights offloaded to disk: one raw ``<name>.dat`` file per tensor plus ``index.json`` (name -> dtype, shape).

Raw files map straight back into memory (read-only, every page mapped at once
where Linux's MAP_POPULATE exists, else `numpy.memmap`), so reading an
offloaded weight costs no copy and no parsing; the page cache does the rest.
NumPy has no bfloat16 (nor float8), so such tensors are stored as integers of
the same width and the index keeps the real dtype name.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.saving import atomic_write
from .prefetch import Prefetcher
from .sizes import set_module_tensor_to_device

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]

INDEX_NAME = "index.json"
# torch dtypes NumPy cannot hold -> the integer dtype of the same width their bits are stored as
_STORED_AS = {"bfloat16": torch.int16}
_WRITE_BYTES = 1 << 30  # bytes per write(2) at most: Linux and macOS take under 2 GiB per call
_PIECE_BYTES = 8 << 20  # a file-to-file copy holds this much at a time, whole 2 MiB pages (see _copy_range)
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _STORED_AS[_name] = torch.uint8


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str],
                   index: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]] | None:
    """Write `weight` to ``offload_folder/<weight_name>.dat`` and record its dtype and shape in `index`.

    Returns `index` (updated in place); call `save_offload_index` to write it.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> offload_weight(torch.ones(2, 3, dtype=torch.bfloat16), "w", folder, index={})
        {'w': {'dtype': 'bfloat16', 'shape': [2, 3]}}
    """
    weight = weight.detach()
    if index is not None:
        index[weight_name] = dat_entry(weight.dtype, weight.shape)
    stored_as = _STORED_AS.get(str(weight.dtype).replace("torch.", ""))
    array = (weight if stored_as is None else weight.view(stored_as)).cpu().numpy()
    path = Path(offload_folder) / f"{weight_name}.dat"
    path.parent.mkdir(parents=True, exist_ok=True)
    # The raw bytes in C order (a scalar is one element), written straight from the array: no mapping, and
    # no msync per file (the folder is scratch space read back through the page cache; a flush per weight was a
    # third of a disk-offloading load). os.write, not ndarray.tofile: tofile went 4x slower (~1 GB/s against ~4).
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
    try:
        written = 0
        while written < len(data):  # one write may take only part of a big buffer
            written += os.write(descriptor, data[written:written + _WRITE_BYTES])
    finally:
        os.close(descriptor)
    return index


def offload_file_range(source: str | os.PathLike[str], offset: int, nbytes: int, dtype: torch.dtype,
                       shape: list[int] | tuple[int, ...], weight_name: str, offload_folder: str | os.PathLike[str],
                       index: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]] | None:
    """Copy a tensor's raw bytes (`nbytes` at `offset` of `source`) to ``offload_folder/<weight_name>.dat``, file to file.

    The same ``.dat`` and index entry as `offload_weight` gives the tensor,
    without holding it in memory: the bytes go through one 8 MiB buffer,
    written in whole 2 MiB pieces so that the page cache keeps huge pages
    for the forwards that map the file. The bytes must be
    C-order and in this machine's byte order, as safetensors files hold them.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp(); _ = Path(folder, "src").write_bytes(b"head" + torch.arange(3.0).numpy().tobytes())
        >>> offload_file_range(f"{folder}/src", 4, 12, torch.float32, [3], "w", folder, index={})
        {'w': {'dtype': 'float32', 'shape': [3]}}
        >>> load_offloaded_weight(f"{folder}/w.dat", {"dtype": "float32", "shape": [3]})
        tensor([0., 1., 2.])
    """
    if index is not None:
        index[weight_name] = dat_entry(dtype, shape)
    path = Path(offload_folder) / f"{weight_name}.dat"
    path.parent.mkdir(parents=True, exist_ok=True)
    reader = os.open(source, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
        try:
            _copy_range(reader, offset, nbytes, writer)
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    return index


def dat_entry(dtype: torch.dtype, shape: list[int] | tuple[int, ...]) -> dict[str, Any]:
    """The index entry of a ``.dat`` file holding a tensor of `dtype` and `shape` (bfloat16 keeps its name).

    Example:
        >>> dat_entry(torch.bfloat16, (2, 3)), dat_entry(torch.float16, [4])
        ({'dtype': 'bfloat16', 'shape': [2, 3]}, {'dtype': 'float16', 'shape': [4]})
    """
    dtype_name = str(dtype).replace("torch.", "")
    if dtype_name not in _STORED_AS:
        dtype_name = str(torch.empty(0, dtype=dtype).numpy().dtype)
    return {"dtype": dtype_name, "shape": list(shape)}


def _copy_range(reader: int, offset: int, nbytes: int, writer: int) -> None:
    """Copy `nbytes` at `offset` of `reader` to `writer`'s position; EOFError if `reader` ends first."""
    # Through a buffer in whole 2 MiB pieces, not copy_file_range: the kernel's splice copy leaves the .dat in the
    # page cache as 4-64 KiB folios, which every offloaded forward maps again one small page at a time and whose
    # TLB misses slow the GEMM ~8% (measured: 0.95 of the in-memory forward). Pieces of 2 MiB let the kernel keep
    # huge folios (Linux 6.x, ext4/xfs) that map in one entry each: 0.97-1.0. On a VM that hands free memory
    # back to its host, the huge pages cost the load ~2 ms per MiB the first time; the forward pays that back.
    buffer = memoryview(bytearray(min(nbytes, _PIECE_BYTES)))
    os.lseek(reader, offset, os.SEEK_SET)  # lseek + read, not pread: Windows has no pread
    done = 0
    while done < nbytes:
        count = _read_into(reader, buffer[:min(nbytes - done, len(buffer))])
        if not count:
            raise EOFError(f"the file ends {nbytes - done} bytes before the tensor at offset {offset} does")
        view = buffer[:count]
        while view:
            view = view[os.write(writer, view):]
        done += count


def _read_into(descriptor: int, view: memoryview) -> int:
    if hasattr(os, "readv"):  # straight into the buffer
        return os.readv(descriptor, [view])
    piece = os.read(descriptor, len(view))  # Windows
    view[:len(piece)] = piece
    return len(piece)


def load_offloaded_weight(weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]) -> torch.Tensor:
    """The tensor in `weight_file`, memory-mapped read-only (no copy); `weight_info` is its index entry.

    The tensor must not be written to (the mapping is read-only); clone it
    to get a private, writable copy.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> index = offload_weight(torch.arange(3.0), "w", folder, index={})
        >>> load_offloaded_weight(f"{folder}/w.dat", index["w"])
        tensor([0., 1., 2.])
    """
    shape = tuple(weight_info["shape"])
    name = weight_info["dtype"]
    stored = _STORED_AS.get(name)
    if int(np.prod(shape)) == 0:
        return torch.empty(shape, dtype=getattr(torch, name) if stored is not None else torch.from_numpy(np.empty(0, name)).dtype)
    np_dtype = torch.empty((), dtype=stored).numpy().dtype if stored is not None else np.dtype(name)
    with warnings.catch_warnings():
        # torch warns that the memory is not writable: that is the point (writes fault, never corrupt the file)
        warnings.filterwarnings("ignore", message="The given (NumPy array|buffer) is not writable")
        tensor = _map_read_only(Path(weight_file), np_dtype, shape)
    return tensor.view(getattr(torch, name)) if stored is not None else tensor


def _map_read_only(path: Path, np_dtype: np.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    populate = getattr(mmap, "MAP_POPULATE", 0)
    nbytes = int(np.prod(shape or (1,))) * np_dtype.itemsize
    if populate and path.stat().st_size == nbytes:
        # Every page mapped in one call: the forward then reads without a page fault per 64 KiB (~5% of a block's time).
        descriptor = os.open(path, os.O_RDONLY)
        try:
            mapping = mmap.mmap(descriptor, nbytes, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
        finally:
            os.close(descriptor)
        return torch.frombuffer(mapping, dtype=torch.from_numpy(np.empty(0, np_dtype)).dtype).view(shape)
    return torch.from_numpy(np.memmap(path, dtype=np_dtype, mode="r", shape=shape or (1,)).reshape(shape))


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]) -> None:
    """Merge `index` into ``offload_folder/index.json`` (created if needed; written atomically).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_offload_index({"w": {"dtype": "float32", "shape": [2]}}, folder)
        >>> sorted(json.loads((Path(folder) / "index.json").read_text()))
        ['w']
    """
    if not index:
        return
    path = Path(offload_folder) / INDEX_NAME
    merged = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    merged.update(index)
    body = json.dumps(merged, indent=2)

    def write(tmp: str) -> None:
        Path(tmp).write_text(body, encoding="utf-8")

    atomic_write(path, write)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> None:
    """Offload every tensor of `state_dict` to `save_dir` and write (merge) its index.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> offload_state_dict(folder, nn.Linear(2, 2).state_dict())
        >>> sorted(p.name for p in Path(folder).iterdir())
        ['bias.dat', 'index.json', 'weight.dat']
    """
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, dict[str, Any]] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Mapping[str, Any]] | None,
                           offload_folder: str | os.PathLike[str]) -> None:
    """Put every weight of `index` (read from `offload_folder`) into `model` on the CPU, one tensor at a time.

    Each weight is copied out of its mapping, so the model owns ordinary
    writable memory and the files can be deleted afterwards.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp(); offload_state_dict(folder, nn.Linear(2, 2).state_dict())
        >>> with torch.device("meta"):
        ...     empty = nn.Linear(2, 2)
        >>> load_offloaded_weights(empty, json.loads((Path(folder) / "index.json").read_text()), folder)
        >>> empty.weight.device
        device(type='cpu')
    """
    index = index or {}
    for name, info in index.items():
        if "SCB" in name:  # bitsandbytes statistics travel with their weight, not as tensors of the model
            continue
        scales = name.replace("weight", "SCB")  # an 8-bit weight's row scales, beside it (Accelerate's names)
        statistics = (load_offloaded_weight(Path(offload_folder) / f"{scales}.dat", index[scales]).clone()
                      if "weight" in name and scales in index else None)
        weight = load_offloaded_weight(Path(offload_folder) / f"{name}.dat", info).clone()
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)
        del weight


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping name -> tensor over an in-memory state dict and weights offloaded to disk.

    The in-memory `state_dict` wins. Disk entries are memory-mapped on access
    (`index` defaults to ``save_folder/index.json``); an entry with a
    ``"safetensors_file"`` is read from that file (tensor ``"weight_name"``,
    cast to ``"dtype"`` when present) onto `device`.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp(); offload_state_dict(folder, {"w": torch.ones(2)})
        >>> weights = OffloadedWeightsLoader(state_dict={"b": torch.zeros(1)}, save_folder=folder)
        >>> sorted(weights), weights["w"]
        (['b', 'w'], tensor([1., 1.]))
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor] | None = None, save_folder: str | os.PathLike[str] | None = None,
                 index: Mapping[str, Any] | None = None, device: int | str | torch.device | None = None) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index of offloaded weights.")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            index = json.loads((Path(save_folder) / INDEX_NAME).read_text(encoding="utf-8"))
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict)
        self.all_keys.extend(key for key in self.index if key not in self.state_dict)
        self.device = device
        # Disk entries of the module expected to run next are read on a thread while the current one computes.
        self.prefetcher = Prefetcher(self._read)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        fetched = self.prefetcher.take(key)
        return self._read(key) if fetched is None else fetched

    def _read(self, key: str) -> torch.Tensor:
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            return self._from_safetensors(key, info)
        if self.save_folder is None:
            raise KeyError(f"{key!r} is offloaded to a .dat file but this loader has no save_folder to read it from.")
        return load_offloaded_weight(Path(self.save_folder) / f"{key}.dat", info)

    def _from_safetensors(self, key: str, info: Mapping[str, Any]) -> torch.Tensor:
        from safetensors import safe_open

        device = "cpu" if self.device is None else (f"cuda:{self.device}" if isinstance(self.device, int) else str(self.device))
        try:
            with safe_open(info["safetensors_file"], framework="pt", device=device) as file:
                tensor = file.get_tensor(info.get("weight_name", key))
        except TypeError:  # some devices cannot take some dtypes directly (bfloat16 on mps): go through the CPU
            with safe_open(info["safetensors_file"], framework="pt", device="cpu") as file:
                tensor = file.get_tensor(info.get("weight_name", key))
        if "dtype" in info:
            tensor = tensor.to(getattr(torch, info["dtype"]))
        return tensor.to(device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


class PrefixedDataset(Mapping):
    """The entries of `dataset` whose keys start with `prefix`, addressed without it (a module's view of a model's weights).

    Example:
        >>> view = PrefixedDataset({"0.weight": 1, "0.bias": 2, "1.weight": 3}, "0.")
        >>> view["weight"], sorted(view), len(view)
        (1, ['bias', 'weight'], 2)
    """

    def __init__(self, dataset: Mapping[str, Any], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return (key[len(self.prefix):] for key in self.dataset if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def announce_offloaded_module(weights_map: Mapping, names: list[str]) -> None:
    """Tell the disk loader behind `weights_map` (seen through any prefixes) that the module reading `names` now runs.

    The loader then reads the module expected next on a background thread.

    Example:
        >>> loader = OffloadedWeightsLoader(state_dict={"a.w": torch.ones(1)})
        >>> announce_offloaded_module(PrefixedDataset(loader, "a."), ["w"])
    """
    prefix, inner = "", weights_map
    while isinstance(inner, PrefixedDataset):
        prefix, inner = inner.prefix + prefix, inner.dataset
    if isinstance(inner, OffloadedWeightsLoader):
        inner.prefetcher.started(prefix, [prefix + n for n in names if prefix + n not in inner.state_dict])


def extract_submodules_state_dict(state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]) -> dict[str, torch.Tensor]:
    """The entries of `state_dict` that belong to one of `submodule_names` ("h.1" takes "h.1.x", not "h.10.x"; "" takes all).

    Example:
        >>> sorted(extract_submodules_state_dict({"h.1.w": 1, "h.10.w": 2, "h.1": 3}, ["h.1"]))
        ['h.1', 'h.1.w']
    """
    result: dict[str, torch.Tensor] = {}
    for module in submodule_names:
        result.update((key, value) for key, value in state_dict.items()
                      if not module or key == module or key.startswith(f"{module}."))
    return result
