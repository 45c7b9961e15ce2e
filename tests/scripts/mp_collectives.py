"""Collectives on nested structures and the PartialState helpers, without an Accelerator.

Usage: mp_collectives.py OUT_DIR

Only `PartialState` and the functions of `hasten.utils` are used: the
process group must come from PartialState alone. Writes OUT_DIR/rank{N}.json
(tensors as nested lists, with dtypes and shapes where they matter).
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

from hasten import PartialState
from hasten.utils import broadcast, broadcast_object_list, gather, gather_object, pad_across_processes, reduce


def describe(data):
    """JSON-able copy of a nested structure; tensors become {dtype, shape, values}, tuples are tagged."""
    if isinstance(data, torch.Tensor):
        return {"dtype": str(data.dtype), "shape": list(data.shape), "values": data.tolist()}
    if isinstance(data, tuple):
        return {"tuple": [describe(x) for x in data]}
    if isinstance(data, list):
        return [describe(x) for x in data]
    if isinstance(data, dict):
        return {k: describe(v) for k, v in data.items()}
    return data


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    state = PartialState(cpu=True)
    rank = state.process_index
    r = float(rank)
    result = {
        "num_processes": state.num_processes,
        "process_index": rank,
        "is_main_process": state.is_main_process,
        "is_last_process": state.is_last_process,
        "is_local_main_process": state.is_local_main_process,
        "use_distributed": state.use_distributed,
    }

    nested = {
        "list": [torch.tensor([r, r + 0.5]), torch.full((1, 3), rank, dtype=torch.int64)],
        "tuple": (torch.tensor(r + 10.0), torch.tensor([[r], [r + 1]])),
        "scalar": torch.tensor(rank + 1),
    }
    result["gather"] = describe(gather(nested))
    result["reduce_sum"] = describe(reduce(nested["tuple"], "sum"))
    result["reduce_mean"] = describe(reduce({"a": [torch.tensor([r, 2 * r + 1.0])], "b": torch.tensor(r + 1.0)}, "mean"))
    result["reduce_scaled"] = describe(reduce(torch.tensor([1.0, r]), "sum", scale=0.5))
    result["input_after_reduce"] = describe(nested["tuple"][0])  # reduce must not modify its input

    to_broadcast = {"w": [torch.full((2,), r), (torch.tensor(rank),)]}
    result["broadcast_from_0"] = describe(broadcast(to_broadcast))
    result["broadcast_from_1"] = describe(broadcast({"v": torch.tensor([r, r])}, from_process=1))

    objects = [{"rank": rank, "name": f"from{rank}"}, "x" * (rank + 1), None]
    result["broadcast_object_list"] = broadcast_object_list(objects)
    result["broadcast_object_list_from_1"] = broadcast_object_list([rank, [rank] * (rank + 2)], from_process=1)

    result["gather_object_list"] = gather_object([f"r{rank}a", f"r{rank}b"][: rank + 1])  # ragged lists concatenate
    result["gather_object_item"] = gather_object({"rank": rank})

    # different lengths per rank: rank 0 has 2 rows, rank 1 has 4
    length = 2 + 2 * rank
    ragged = torch.arange(length, dtype=torch.int64) + 100 * rank
    result["pad_last"] = describe(pad_across_processes(ragged, pad_index=-1))
    result["pad_first"] = describe(pad_across_processes(ragged, pad_index=-1, pad_first=True))
    result["pad_gathered"] = describe(gather(pad_across_processes({"ids": [ragged]}, pad_index=-1)))
    matrix = torch.ones(2, length) * (rank + 1)
    result["pad_dim1"] = describe(pad_across_processes(matrix, dim=1, pad_index=0))
    result["pad_dim1_first"] = describe(pad_across_processes({"m": (matrix,)}, dim=1, pad_index=7, pad_first=True))

    items = ["a", "b", "c", "d", "e"]
    with state.split_between_processes(items) as mine:
        result["split"] = mine
    with state.split_between_processes(items, apply_padding=True) as mine:
        result["split_padded"] = mine
    with state.split_between_processes({"x": items, "y": list(range(5))}) as mine:
        result["split_dict"] = mine
    with state.split_between_processes(torch.arange(5), apply_padding=True) as mine:
        result["split_tensor_padded"] = mine.tolist()
        result["split_gathered"] = gather(mine).tolist()

    # decorators: each returns a value only where it runs
    @state.on_main_process
    def on_main():
        return "main"

    @state.on_last_process
    def on_last():
        return "last"

    @state.on_process(process_index=1)
    def on_one():
        return "one"

    @state.on_local_main_process
    def on_local_main():
        return "local main"

    result["decorated"] = [on_main(), on_last(), on_one(), on_local_main()]

    # main_process_first: rank 0 runs the block (slowly) and leaves a marker before anyone else enters
    marker = out_dir / "main_done"
    with state.main_process_first():
        entered = time.time()
        marker_seen = marker.exists()
        if state.is_main_process:
            time.sleep(1.0)
            marker.write_text("done")
    result["main_first"] = {"entered": entered, "marker_seen_on_entry": marker_seen}
    state.wait_for_everyone()

    result["env_rank"] = os.environ.get("RANK")
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
