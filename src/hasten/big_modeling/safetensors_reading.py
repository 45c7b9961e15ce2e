"""Reading a safetensors file tensor by tensor for `load_checkpoint_in_model`, or handing out where a tensor's bytes lie.

A tensor bound for the disk offload folder in its own dtype needs no trip
through memory: `read_safetensors` hands it out as a `FileRange` (file,
offset, length, dtype, shape), which the loader copies file to file into its
``.dat`` (`offload.offload_file_range`). A checkpoint's bytes are raw,
little-endian and in C order, exactly what a ``.dat`` holds.

Example:
    >>> import tempfile, torch
    >>> from safetensors.torch import save_file
    >>> path = Path(tempfile.mkdtemp()) / "w.safetensors"; save_file({"w": torch.ones(2, 3)}, str(path))
    >>> [(name, type(item).__name__) for name, item in read_safetensors(path, raw=lambda name: True)]
    [('w', 'FileRange')]
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["FileRange", "read_safetensors"]

# safetensors dtype codes whose bytes a .dat file holds as they are (its index names the dtype)
_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
           "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
for _code, _name in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _name):
        _DTYPES[_code] = getattr(torch, _name)
_REOPEN_BYTES = 64 * 2**20


@dataclass(frozen=True)
class FileRange:
    """Where one tensor's raw bytes lie in a file, with what `load` reads them into memory when they are needed there.

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> path = Path(tempfile.mkdtemp()) / "w.safetensors"; save_file({"w": torch.ones(2)}, str(path))
        >>> item = next(read_safetensors(path, raw=lambda name: True))[1]
        >>> item.shape, item.dtype, item.nbytes, item.load()
        (torch.Size([2]), torch.float32, 8, tensor([1., 1.]))
    """

    file: Path
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size
    load: Callable[[], torch.Tensor]

    def is_floating_point(self) -> bool:
        """True for floating-point dtypes, as `torch.Tensor.is_floating_point`.

        Example:
            >>> FileRange(Path("x"), 0, 4, torch.float32, torch.Size([1]), lambda: torch.ones(1)).is_floating_point()
            True
        """
        return self.dtype.is_floating_point


def _ranges(file: Path) -> dict[str, tuple[int, int, torch.dtype, torch.Size]]:
    """name -> (offset, bytes, dtype, shape) of the header's tensors whose bytes can be copied as they are."""
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    ranges = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(str(entry.get("dtype"))) if isinstance(entry, dict) and name != "__metadata__" else None
        if dtype is not None:
            begin, end = entry["data_offsets"]
            ranges[name] = (8 + length + begin, end - begin, dtype, torch.Size(entry["shape"]))
    return ranges


def read_safetensors(file: Path, private: Callable[[str], bool] | None = None,
                     raw: Callable[[str], bool] | None = None,
                     keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor | FileRange]]:
    """Tensors of a safetensors file; each one `private` names read into memory of its own, the others mapped.

    Of the mapped ones, those `keep` names (weights that stay in CPU memory)
    come from a mapping of their own, which lives as long as they do: the
    model's CPU weights are then the page cache's pages (copy-on-write), as
    under Accelerate, with no copy at load time (an 800 MB CPU load took
    0.5-1.0 s copied, 0.08 s mapped here). The others' mapping goes when the
    load ends, and with it the pages they touched.

    The names `raw` accepts come as a `FileRange` instead (its `load` reads
    the tensor, as `private` would, while this generator is suspended on it).
    Private tensors (the ones that stay in CPU memory, or pass through it to
    the disk) are read with pread(2) where safetensors can: nothing lingers in
    resident memory. A tensor bound for a GPU is taken straight from the
    file's mapping and copied once, to the GPU (reading it into fresh memory
    first made a GPU load 2.4x slower than Accelerate's on an H200 machine).

    Older safetensors only map the file: every page read stays resident
    while the mapping lives, and tensors may be views of it. There each
    private tensor is copied out and the file is reopened every 64 MiB,
    which bounds what a big shard adds to resident memory.

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> path = Path(tempfile.mkdtemp()) / "w.safetensors"; save_file({"w": torch.ones(2)}, str(path))
        >>> list(read_safetensors(path))
        [('w', tensor([1., 1.]))]
    """
    from safetensors import safe_open

    try:
        handle, own = safe_open(str(file), framework="pt", device="cpu", backend="pread"), True
    except TypeError:  # safetensors < 0.8 has no backend choice
        handle, own = safe_open(str(file), framework="pt", device="cpu"), False
    # raw copies need the file's bytes as they are: little-endian, which safetensors always writes
    ranges = _ranges(file) if raw is not None and sys.byteorder == "little" else {}
    mapped: Any = None  # the mapping, opened for the first tensor bound for a GPU
    kept: Any = None  # the mapping the kept (CPU) weights are views of
    read = 0
    for name in list(handle.keys()):
        if name in ranges and raw is not None and raw(name):
            offset, nbytes, dtype, shape = ranges[name]
            load = (lambda name=name: handle.get_tensor(name)) if own else (lambda name=name: handle.get_tensor(name).clone())
            yield name, FileRange(file, offset, nbytes, dtype, shape, load)
            continue
        if private is not None and not private(name):
            if own and keep is not None and keep(name):
                if kept is None:
                    kept = safe_open(str(file), framework="pt", device="cpu")
                yield name, kept.get_tensor(name)
                continue
            if mapped is None:
                mapped = safe_open(str(file), framework="pt", device="cpu") if own else handle
            yield name, mapped.get_tensor(name)
            continue
        if not own and read >= _REOPEN_BYTES:
            del handle  # unmaps the file, dropping the pages read so far from this process
            handle, read = safe_open(str(file), framework="pt", device="cpu"), 0
        tensor = handle.get_tensor(name)
        if not own:
            tensor = tensor.clone()
        read += tensor.numel() * tensor.element_size()
        yield name, tensor
        del tensor
    del handle, mapped, kept
