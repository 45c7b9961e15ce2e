"""Collectives with awkward inputs, and mismatches without debug mode. Writes OUT_DIR/rank{N}.json.

Usage: mp_collective_inputs.py OUT_DIR [board|all-reduce] -- how the processes compare
signatures: the shared-memory board `hasten launch` provides on one machine, or the
tiny all-reduce used elsewhere (forced here by hiding the board's directory).
"""

import json
import os
import sys
from pathlib import Path

import torch

from hasten import PartialState
from hasten.process import board as host_board
from hasten.utils import broadcast, gather, pad_across_processes, reduce

out_dir = Path(sys.argv[1])
if sys.argv[2:] == ["all-reduce"]:
    os.environ.pop(host_board.BOARD_DIR_ENV)
state = PartialState(cpu=True)
rank = state.process_index
result = {"path": "board" if host_board.board() is not None else "all-reduce"}

# tensors that require grad, non-contiguous, 0-d, empty, and mixed dtypes in one structure
weight = torch.full((2, 3), float(rank + 1), requires_grad=True)
gathered = gather({"grad": weight * 2, "t": torch.arange(6.0).reshape(2, 3).t() + rank, "scalar": torch.tensor(rank),
                   "empty": torch.zeros(0, 4), "ints": torch.tensor([rank], dtype=torch.int32)})
result["gather"] = {k: [list(v.shape), str(v.dtype), v.tolist(), v.requires_grad] for k, v in gathered.items()}
reduced = {op: reduce(torch.tensor([rank + 1.0, -rank - 2.0], requires_grad=True), op).tolist()
           for op in ("sum", "mean", "max", "min", "product")}
reduced["int_mean"] = reduce(torch.tensor([rank + 1]), "mean").tolist()
reduced["0d"] = reduce(torch.tensor(rank + 1.0), "max").tolist()
result["reduce"] = reduced
column = torch.zeros(3, 2)[:, 0]  # non-contiguous
column += rank + 5
result["broadcast"] = broadcast(column, from_process=1).tolist()
result["pad"] = pad_across_processes(torch.ones(rank + 1, 2, requires_grad=True)).shape[0]

# every dtype through the small path (on one machine: the board's shared memory) and past its size limit
kinds = {}
for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int64, torch.complex64, torch.bool):
    value = torch.tensor([rank + 1, 2], dtype=torch.float64).to(dtype)
    largest = reduce(value, "max").tolist() if not dtype.is_complex else None  # torch refuses MAX on complex
    kinds[str(dtype)] = [str(x) for x in (reduce(value, "sum").tolist(), largest, gather(value).tolist(),
                                          broadcast(value.clone(), from_process=1).tolist())]
try:
    reduce(torch.ones(1, dtype=torch.complex64), "max")
except ValueError as error:
    kinds["complex max"] = str(error)
result["kinds"] = kinds
for count in (126, 127, 300):  # 504 bytes: the largest payload the board carries; the others take the network
    result[f"sum_{count}"] = reduce(torch.arange(count, dtype=torch.float32) * (rank + 1), "sum").tolist()
    result[f"gather_{count}"] = gather(torch.full((count,), float(rank))).sum().item()
result["pad_nested"] = [list(t.shape) for t in pad_across_processes(
    [torch.ones(2, rank + 1), torch.ones(3, rank + 3), torch.tensor(1.0)], dim=1)]
calls, originals = [], {name: getattr(torch.distributed, name) for name in ("all_reduce", "broadcast", "all_gather_object")}
for name, original in originals.items():
    setattr(torch.distributed, name, lambda *a, _original=original, _name=name, **k: (calls.append(_name), _original(*a, **k))[1])
reduce(torch.ones(3)), gather(torch.ones(3)), broadcast(torch.ones(3)), pad_across_processes(torch.ones(rank + 1))
for name, original in originals.items():
    setattr(torch.distributed, name, original)
result["network_calls"] = calls

# mismatches, without debug mode: one clear error on every rank
errors = {}
cases = {
    "same_count": lambda: gather(torch.zeros(4) if rank == 0 else torch.zeros(2, 2)),
    "different_count": lambda: gather(torch.zeros(4) if rank == 0 else torch.zeros(5)),
    "dtype": lambda: reduce(torch.zeros(3) if rank == 0 else torch.zeros(3, dtype=torch.float64)),
    "different_ops": lambda: gather(torch.zeros(2)) if rank == 0 else reduce(torch.zeros(2)),
    "small_and_large": lambda: reduce(torch.zeros(4) if rank == 0 else torch.zeros(200)),  # board values vs network
    "pad_and_gather": lambda: pad_across_processes(torch.zeros(2)) if rank == 0 else gather(torch.zeros(2)),
}
for name, call in cases.items():
    try:
        call()
        errors[name] = None
    except (ValueError, RuntimeError) as error:
        errors[name] = f"{type(error).__name__}: {error}"
result["errors"] = errors
result["after"] = gather(torch.tensor([rank])).tolist()  # the group still works after the errors
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
state.destroy_process_group()
