"""`load_checkpoint_in_model`: read a checkpoint tensor by tensor into a model, each tensor onto its mapped device.

Only one tensor of the checkpoint is in memory at a time (safetensors files
are read entry by entry, torch files are memory-mapped), so a model whose
weights go partly to disk loads within the CPU budget plus one tensor.
With `broadcast_from_rank0`, only rank 0 reads the files and sends each
tensor to the other ranks as it goes (one tensor in flight at a time).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import pickle
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import nn

from .filenames import checkpoint_files
from ..logging import get_logger
from .bnb_checkpoint import ScalePairing, quantize_and_offload_8bit, scale_name
from .bnb_params import is_quantized_param
from .copies import ParallelCopies
from .offload import dat_entry, load_offloaded_weights, offload_file_range, offload_weight, save_offload_index
from .safetensors_reading import FileRange, read_safetensors
from .sizes import (
    _device_in_map,
    _owner,
    _to_dtype,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
    set_module_tensor_to_device,
)

__all__ = ["checkpoint_files", "load_checkpoint_in_model"]

logger = get_logger(__name__)


def _damaged(file: Path, error: BaseException) -> ValueError:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ValueError(f"{file} is damaged or truncated ({reason}); re-save the checkpoint or download the file again.")


def _read_tensors(file: Path, private: Callable[[str], bool] | None = None,
                  raw: Callable[[str], bool] | None = None,
                  keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor | FileRange]]:
    """``(name, tensor)`` of one weights file, one tensor at a time, each a private copy the caller may keep.

    `private`: the names that need a copy of their own (None: all); the
    others may be views of the file, valid until the next tensor is read.
    `raw`: the names a safetensors file may hand out as a `FileRange`.
    `keep`: of the others, those the caller keeps (CPU weights): views of a mapping that lives as long as they do.
    """
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError

        try:
            yield from read_safetensors(file, private, raw, keep)
        except SafetensorError as error:
            raise _damaged(file, error) from None
        return
    mapped = True
    state: Any  # torch.load's value; checked to be a mapping below
    try:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            mapped = False  # legacy (non-zip) files cannot be mapped
            state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise  # a refused pickle is a safety decision, not damage: keep torch's own explanation
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        raise _damaged(file, error) from None
    if not isinstance(state, Mapping):
        raise ValueError(f"{file} holds a {type(state).__name__}, not a state dict of tensors.")
    entries: Any = state  # torch.load gives a dict: emptied as it is read
    for name in list(entries):
        tensor = entries.pop(name)
        # mapped tensors alias the file: copy so the model never depends on (or faults on) a file that may be rewritten
        copy = tensor.clone()
        if mapped:
            _release_pages(tensor)
        del tensor
        yield name, copy
        del copy


def _release_pages(tensor: torch.Tensor) -> None:
    """Drop the pages of a file-mapped tensor from this process (Linux); the page cache keeps them.

    torch maps the whole file at once and unmaps it only when its last
    tensor dies, so without this every page read would stay resident until
    the end of the file. Only whole pages inside the tensor's own storage
    are released, and they are clean file pages: touching them again would
    just read the file again.
    """
    libc = _libc()
    if libc is None:
        return
    storage = tensor.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)


_MADV_DONTNEED = 4


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def _file_tensors(files: list[Path], private: Callable[[str], bool] | None = None,
                  raw: Callable[[str], bool] | None = None,
                  keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, str, torch.Tensor | FileRange]]:
    """``(file name, tensor name, tensor)`` of the weight files, one tensor at a time (`private`, `raw`, `keep`: see
    `_read_tensors`)."""
    for file in files:
        for name, tensor in _read_tensors(file, private, raw, keep):
            yield file.name, name, tensor


def _rank0_tensors(checkpoint: str | os.PathLike[str]) -> Iterator[tuple[str, str, torch.Tensor]]:
    # the files are resolved inside the generator, so a bad path is one more failure `_send` reports to the others
    # no `raw` names: every item is a tensor
    yield from cast(Iterator[tuple[str, str, torch.Tensor]], _file_tensors(checkpoint_files(checkpoint)))


def _broadcast_tensors(checkpoint: str | os.PathLike[str]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """The checkpoint's tensors on every rank: rank 0 reads and broadcasts them, the others receive them."""
    import torch.distributed as dist

    # nccl moves only CUDA tensors; every other backend (gloo, mpi) moves CPU ones
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    yield from (_send(_rank0_tensors(checkpoint), device) if dist.get_rank() == 0 else _receive(device))


def _send(tensors: Iterator[tuple[str, str, torch.Tensor]], device: torch.device) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Rank 0: broadcast each tensor (a header, then its bytes) before handing it on, then an end marker."""
    import torch.distributed as dist

    while True:
        try:
            item = next(tensors, None)
        except Exception as error:
            # the other ranks wait for a header: tell them why none comes, or they would wait until the timeout
            dist.broadcast_object_list([{"error": f"{type(error).__name__}: {error}"}], src=0, device=device)
            raise
        if item is None:
            dist.broadcast_object_list([None], src=0, device=device)
            return
        file_name, name, tensor = item
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)  # bytes: any dtype crosses any backend
        header = {"file": file_name, "name": name, "shape": tuple(tensor.shape),
                  "dtype": str(tensor.dtype).removeprefix("torch."), "bytes": data.numel()}
        dist.broadcast_object_list([header], src=0, device=device)
        if data.numel():
            dist.broadcast(data.to(device), src=0)
        del data
        yield item


def _receive(device: torch.device) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Other ranks: the tensors rank 0 broadcasts, in its order, until its end marker."""
    import torch.distributed as dist

    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, device=device)
        header = box[0]
        if header is None:
            return
        if "error" in header:
            raise RuntimeError(f"rank 0 could not read the checkpoint ({header['error']}), so there is nothing to "
                               "receive; fix that on rank 0 and load again.")
        data = torch.empty(header["bytes"], dtype=torch.uint8, device=device)
        if header["bytes"]:
            dist.broadcast(data, src=0)
        yield header["file"], header["name"], data.view(getattr(torch, header["dtype"])).reshape(header["shape"])
        del data


def _dtensor_class() -> type | None:
    # No DTensor exists unless its module was imported; importing it here would cost ~40 MiB of RSS for nothing.
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _fp32_match(name: str, keep_in_fp32_modules: list[str]) -> bool:
    """True if a module named in `keep_in_fp32_modules` ("wo", "encoder.norm") appears in `name` as whole components."""
    parts = name.split(".")
    for key in keep_in_fp32_modules:
        want = key.split(".")
        if any(parts[i:i + len(want)] == want for i in range(len(parts) - len(want) + 1)):
            return True
    return False


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Mapping[str, int | str | torch.device] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load `checkpoint` (a file, an ``.index.json`` of shards, or a folder) into `model`, tensor by tensor.

    Each tensor goes to the device `device_map` gives its module (the
    longest matching name; "" covers all). Tensors mapped to "disk" are
    written to `offload_folder` (``<name>.dat`` + ``index.json``) and stay on
    ``meta`` in the model; so do buffers there when `offload_buffers`, else
    buffers are kept on the CPU. Without a map, tensors keep the model's
    devices (``meta`` ones go to the CPU) and real tensors are filled in
    place. `dtype` casts floating-point tensors, except those under
    `keep_in_fp32_modules`, which become float32; without `dtype` each
    tensor takes the model's dtype. `offload_state_dict` parks CPU tensors
    on disk until the end. Missing and unexpected keys are a ValueError with
    `strict`, else a warning. Tied parameters are tied again at the end.
    bitsandbytes layers quantize their weights as they are placed; an int8
    weight is placed with its scales (``<module>.SCB``, wherever the file
    has them), and with `offload_8bit_bnb` the 8-bit weights bound for disk
    (or parked there) are quantized first and written with their scales
    (`bnb_checkpoint.py`).

    Parameters that are DTensors (a model sharded with FSDP2 / tensor
    parallelism, already materialised) are filled in place: each process
    keeps its own shard of every full tensor read. `full_state_dict=True`
    says the checkpoint holds full tensors, which files always do; False
    (a state dict of DTensor shards) is refused for such a model and means
    the same as True for a plain one. With `broadcast_from_rank0`, under an
    initialised process group, only rank 0 reads `checkpoint` (the path
    need not exist elsewhere) and broadcasts each tensor; every rank then
    places it as above (each offloads to its own `offload_folder`: give
    ranks sharing a disk different folders).

    Example:
        >>> import tempfile
        >>> from hasten.checkpointing.model_files import write_model_files
        >>> folder = tempfile.mkdtemp(); _ = write_model_files(nn.Linear(2, 2).state_dict(), folder)
        >>> with torch.device("meta"):
        ...     empty = nn.Linear(2, 2)
        >>> load_checkpoint_in_model(empty, folder, device_map={"": "cpu"}, strict=True)
        >>> empty.weight.device
        device(type='cpu')
    """
    if broadcast_from_rank0 and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ValueError("broadcast_from_rank0=True needs an initialized torch.distributed process group (rank 0 reads, "
                         "the other ranks receive); call init_process_group first or pass broadcast_from_rank0=False.")
    dtensor = _dtensor_class()
    sharded = dtensor is not None and any(isinstance(t, dtensor) for t in model.state_dict(keep_vars=True).values())
    if sharded and not full_state_dict:
        raise ValueError("full_state_dict=False means a state dict of DTensor shards, which a checkpoint file of full "
                         "tensors never is; pass full_state_dict=True (each process then keeps its shard of them).")
    if sharded and device_map is not None:
        raise ValueError("this model's parameters are DTensors (already sharded over a device mesh), which a device_map "
                         "cannot move; load it without device_map.")
    dtype = _to_dtype(dtype)
    if device_map is not None and "disk" in device_map.values() and offload_folder is None:
        raise ValueError("the device_map sends modules to 'disk' but no offload_folder was given; pass "
                         "offload_folder=<a folder for the offloaded weights>.")
    # resolved now (unless another rank reads them): a bad path fails before anything is written
    def on_cpu(name: str) -> bool:
        device = _device_in_map(name, device_map)  # type: ignore[arg-type]
        if isinstance(device, torch.device):
            return device.type == "cpu"
        return isinstance(device, str) and device.startswith("cpu")

    def private(name: str) -> bool:  # False: bound for a GPU or kept in CPU memory, so a view of the file will do
        if device_map is None or offload_state_dict:
            return True
        device = _device_in_map(name, device_map)
        if isinstance(device, torch.device):
            return device.type == "meta"
        return isinstance(device, str) and device in ("disk", "meta")

    def keep(name: str) -> bool:  # True: a CPU weight, kept as a view of its own mapping (as Accelerate's are)
        return device_map is not None and not offload_state_dict and on_cpu(name)

    def raw(name: str) -> bool:  # True: bound for a .dat file, where its bytes may go file to file
        device = None if device_map is None else _device_in_map(name, device_map)
        return device == "disk" or (offload_state_dict and str(device) == "cpu")

    tensors = (_broadcast_tensors(checkpoint) if broadcast_from_rank0
               else _file_tensors(checkpoint_files(checkpoint), private, raw, keep))
    tied = find_tied_parameters(model)
    if device_map is not None:
        check_tied_parameters_on_same_device(tied, device_map)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
    # names, shapes and dtypes only: holding the tensors themselves would keep replaced weights alive
    expected = {name: (tensor.shape, tensor.dtype) for name, tensor in model.state_dict(keep_vars=True).items()}
    buffers = {name for name, _ in model.named_buffers()}
    twin_of = {name: group for group in tied for name in group}
    staging = tempfile.mkdtemp(prefix="hasten-state-") if offload_state_dict else None
    offload_index: dict[str, Any] = {}
    staged_index: dict[str, Any] = {}
    in_memory: set[str] = set()  # names whose data now lives in the model (not on meta)
    loaded: set[str] = set()
    unexpected: list[str] = []
    fp32 = list(keep_in_fp32_modules or [])
    copies = ParallelCopies()
    try:
        for file_name, name, tensor, scales in ScalePairing(model).stream(tensors):
            if name not in expected:
                unexpected.append(name)
                continue
            shape, model_dtype = expected[name]
            if tensor.shape != shape:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)} in {file_name} but {tuple(shape)} in the model.")
            cast = None  # None: take the model's dtype, as load_state_dict does
            if dtype is not None and tensor.is_floating_point():
                cast = torch.float32 if fp32 and _fp32_match(name, fp32) else dtype
            device = None if device_map is None else _device_in_map(name, device_map)
            if isinstance(device, torch.device) and device.type == "cpu":
                device = "cpu"
            if device == "disk" and name in buffers and not offload_buffers:
                device = "cpu"  # buffers stay in memory; hooks move them to the execution device
            if device == "disk" or (device == "cpu" and staging is not None):
                folder, index = (offload_folder, offload_index) if device == "disk" else (staging, staged_index)
                assert folder is not None  # offload_folder was required above for "disk"; staging exists for "cpu"
                target = (cast or model_dtype) if tensor.is_floating_point() else tensor.dtype
                if offload_8bit_bnb and _quantized(model, name):  # written as int8 rows + scales (Accelerate's files)
                    new_dtype = cast or dtype or model_dtype  # (dtype, not the int8 of quantized data: Accelerate's)
                    quantize_and_offload_8bit(model, _loaded(tensor), name, new_dtype, folder, index,  # type: ignore[arg-type]
                                              None if scales is None else _loaded(scales))
                    loaded.add(name)
                    continue
                set_module_tensor_to_device(model, name, "meta", dtype=target)
                if scales is not None:  # an 8-bit weight read quantized: its scales go beside it
                    offload_weight(_loaded(scales), scale_name(name), folder, index=index)
                if isinstance(tensor, FileRange) and tensor.dtype == target:  # never enters this process's memory
                    index[name] = dat_entry(target, tensor.shape)  # here, so the index keeps the checkpoint's order
                    copies.submit(_copy_to_dat, tensor, name, folder)
                else:
                    offload_weight(_loaded(tensor).to(target), name, folder, index=index)
            elif in_memory.intersection(twin_of.get(name, ())):
                _share(model, name, next(n for n in twin_of[name] if n in in_memory))  # one copy of a tied weight
                in_memory.add(name)
            else:
                _place(model, name, _loaded(tensor), device, cast, None if scales is None else _loaded(scales))
                in_memory.add(name)
            loaded.add(name)
            del tensor  # drop the only reference before reading the next one
        copies.wait()
        if offload_folder is not None:
            save_offload_index(offload_index, offload_folder)
        if staging is not None:
            load_offloaded_weights(model, staged_index, staging)
            in_memory.update(staged_index)
    finally:
        copies.wait(raise_errors=False)  # on a failure: nothing writes into the folders once the caller sees it
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    _retie(model, tied, in_memory)
    _report(model, checkpoint, expected, loaded, unexpected, tied, strict)


def _copy_to_dat(tensor: FileRange, name: str, folder: str | os.PathLike[str]) -> None:
    """On a copy thread: the tensor's bytes, file to file, into ``folder/<name>.dat``."""
    try:
        offload_file_range(tensor.file, tensor.offset, tensor.nbytes, tensor.dtype, tensor.shape, name, folder)
    except EOFError as error:
        raise _damaged(tensor.file, error) from None


def _loaded(tensor: torch.Tensor | FileRange) -> torch.Tensor:
    return tensor.load() if isinstance(tensor, FileRange) else tensor


def _quantized(model: nn.Module, name: str) -> bool:
    owner, leaf = _owner(model, name)
    return is_quantized_param(owner._parameters.get(leaf))


def _place(model: nn.Module, name: str, tensor: torch.Tensor, device: Any, cast: torch.dtype | str | None,
           scales: torch.Tensor | None = None) -> None:
    """Put one checkpoint tensor into the model; without a device map, fill real tensors in place.

    Filling in place keeps the tensor's identity (ties, optimizer references)
    and device; ``meta`` tensors go to the CPU. A bitsandbytes weight is
    placed (and so quantized), never filled, with its 8-bit `scales`.
    """
    owner, leaf = _owner(model, name)
    current = getattr(owner, leaf)
    dtensor = _dtensor_class()
    if dtensor is not None and isinstance(current, dtensor):
        _fill_shard(name, current, tensor, cast)
        return
    quantized = is_quantized_param(current)
    if device is None and not current.is_meta and (cast is None or cast == current.dtype) and not quantized:
        with torch.no_grad():
            current.copy_(tensor)
        return
    if device is None:
        device = "cpu" if current.is_meta else current.device
    set_module_tensor_to_device(model, name, device, value=tensor, dtype=cast, fp16_statistics=scales, clear_cache=False)


def _fill_shard(name: str, current: Any, tensor: torch.Tensor, cast: torch.dtype | str | None) -> None:
    """Copy this process's shard of the full `tensor` into the DTensor `current`, in place (FSDP keeps its references)."""
    from torch.distributed.tensor import distribute_tensor

    if current.is_meta:
        raise ValueError(f"{name} is a DTensor on the meta device, so there is no shard to fill; materialise the sharded "
                         "model first (model.to_empty(device=...)), then load.")
    if cast is not None and cast != current.dtype:
        raise ValueError(f"{name} is a DTensor of {current.dtype}, whose dtype cannot change in place to {cast}; cast the "
                         "model before sharding it, or load without dtype.")
    full = tensor.to(current.device_mesh.device_type)
    try:  # every process holds the full tensor: each slices its own shard, no communication
        shard = distribute_tensor(full, current.device_mesh, current.placements, src_data_rank=None)
    except TypeError:  # torch < 2.6 has no src_data_rank: scatter from the first rank (same data anyway)
        shard = distribute_tensor(full, current.device_mesh, current.placements)
    with torch.no_grad():
        current.copy_(shard)


def _share(model: nn.Module, name: str, source: str) -> None:
    source_owner, source_leaf = _owner(model, source)
    owner, leaf = _owner(model, name)
    setattr(owner, leaf, getattr(source_owner, source_leaf))


def _retie(model: nn.Module, tied: list[list[str]], in_memory: set[str]) -> None:
    """Tie each group to the weight the checkpoint gave it (not to a stale initial value); else as before."""
    for group in tied:
        source = next((n for n in group if n in in_memory), None)
        if source is None:
            retie_parameters(model, [group])
            continue
        for name in group:
            if name != source:
                _share(model, name, source)


def _report(model: nn.Module, checkpoint: Any, expected: Mapping[str, Any], loaded: set[str], unexpected: list[str],
            tied: list[list[str]], strict: bool) -> None:
    covered = set(loaded)
    for group in tied:  # checkpoints often store a tied weight under one of its names only
        if covered.intersection(group):
            covered.update(group)
    missing = [name for name in expected if name not in covered]
    if not missing and not unexpected:
        return
    what = " and ".join(part for part in (
        f"{len(missing)} missing key(s) ({_listed(missing)})" if missing else "",
        f"{len(unexpected)} unexpected key(s) ({_listed(unexpected)})" if unexpected else "") if part)
    message = f"the checkpoint at {checkpoint} does not match {type(model).__name__}: {what}."
    if strict:
        raise ValueError(message + " Load it with strict=False to accept that.")
    unused = f" Its unexpected weights were not used when initializing {type(model).__name__}." if unexpected else ""
    kept = " Missing weights keep what the model had (nothing, for tensors on meta)." if missing else ""
    logger.warning(message + unused + kept)
