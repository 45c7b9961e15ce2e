"""Tensor parallel (and 2-D FSDP x TP) against the unsplit model, in every process.

Usage: tp_check.py OUT_DIR    (2 processes: TP checks; 4 processes: mesh names + FSDP x TP)

Every process builds the same models from one seed and keeps an unsplit copy
as the reference; sharded gradients are gathered (``full_tensor``) and
compared by name. Writes OUT_DIR/rank{N}.json.
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hasten import PartialState
from hasten.strategies.parallel import apply_tensor_parallel
from hasten.parallelism_config import ParallelismConfig


class MLP(torch.nn.Module):
    def __init__(self, width: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.up_proj = torch.nn.Linear(width, hidden)
        self.down_proj = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": MLP()}) for _ in range(2)])
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["mlp"](x)
        return self.norm(x)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def max_diff(a, b) -> float:
    return (full(a).double() - full(b).double()).abs().max().item()


def compare(model, reference, x, y, steps: int = 2, rows: slice = slice(None)) -> dict:
    """Output and gradient differences over `steps` SGD steps; `model` sees only `rows` of the batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_params = dict(reference.named_parameters())
    out = {"output": [], "grad": []}
    for _ in range(steps):
        ref_out = reference(x)
        torch.nn.functional.mse_loss(ref_out, y).backward()
        local_out = model(x[rows])
        torch.nn.functional.mse_loss(local_out, y[rows]).backward()
        out["output"].append(max_diff(local_out, ref_out[rows]))
        out["grad"].append(max(max_diff(p.grad, ref_params[n].grad) for n, p in model.named_parameters()))
        for opt in (optimizer, ref_optimizer):
            opt.step()
            opt.zero_grad()
    out["sharded"] = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    out["names_match"] = sorted(n for n, _ in model.named_parameters()) == sorted(ref_params)
    return out


def two_processes(result: dict) -> None:
    config = ParallelismConfig(tp_size=2)
    mesh = config.build_device_mesh("cpu")
    result["mesh_dims"] = list(mesh.mesh_dim_names)
    tp_mesh = config.submesh("tp")
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=generator), torch.randn(6, 8, generator=generator)

    torch.manual_seed(0)
    reference = MLP()
    model = apply_tensor_parallel(copy.deepcopy(reference), tp_mesh, {"up_proj": "colwise", "down_proj": "rowwise"})
    result["mlp"] = compare(model, reference, x, y)

    # wildcard plan, and a ParallelStyle object instead of a name
    from torch.distributed.tensor.parallel import RowwiseParallel

    torch.manual_seed(0)
    reference = Stack()
    plan = {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": RowwiseParallel()}
    result["stack"] = compare(apply_tensor_parallel(copy.deepcopy(reference), mesh, plan), reference, x, y)

    # the model's own plan (as transformers models carry it), with entries it lacks skipped
    model = copy.deepcopy(reference)
    model._tp_plan = {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise", "lm_head": "colwise"}
    result["own_plan"] = compare(apply_tensor_parallel(model, tp_mesh), copy.deepcopy(reference), x, y, steps=1)


def four_processes(result: dict) -> None:
    from torch.distributed.fsdp import fully_shard

    meshes = {}
    for sizes in ({"dp_replicate_size": 2, "dp_shard_size": 2}, {"dp_shard_size": 4}):
        config = ParallelismConfig(**sizes)
        mesh = config.build_device_mesh("cpu")
        meshes[str(sizes)] = {"dims": list(mesh.mesh_dim_names),
                              "flat": {k: v.size() for k, v in config.flattened_meshes.items()}}
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    mesh = config.build_device_mesh("cpu")
    meshes["fsdp_tp"] = {"dims": list(mesh.mesh_dim_names),
                         "flat": {k: v.size() for k, v in config.flattened_meshes.items()},
                         "tp_ranks": dist.get_process_group_ranks(config.submesh("tp").get_group()),
                         "dp_ranks": dist.get_process_group_ranks(config.submesh("dp").get_group())}
    result["meshes"] = meshes

    # FSDP over "dp_shard" x TP over "tp": each dp rank trains on its half of the batch
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)
    dp_rank = config.submesh("dp").get_local_rank()
    torch.manual_seed(0)
    reference = Stack()
    model = apply_tensor_parallel(copy.deepcopy(reference), config.submesh("tp"),
                                  {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"})
    fully_shard(model, mesh=config.submesh("dp_shard_cp"))
    result["fsdp_tp"] = compare(model, reference, x, y, rows=slice(dp_rank * 4, dp_rank * 4 + 4))


def main(out: Path) -> None:
    state = PartialState(cpu=True)
    result = {"rank": state.process_index}
    if state.num_processes == 2:
        two_processes(result)
    else:
        four_processes(result)
    (out / f"rank{state.process_index}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
