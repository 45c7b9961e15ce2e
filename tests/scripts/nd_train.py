"""N-D parallel training through `Accelerator(parallelism_config=...)`, every layout of this many processes.

Usage: nd_train.py OUT_DIR    (2 processes: dp_shard=2, dp_replicate=2, tp=2;
                               4 processes: dp_shard=4, dp_replicate=4, HSDP 2x2, dp_shard=2 x tp=2, tp=4,
                               dp_replicate=2 x tp=2,
                               and save_state / load_state for HSDP, FSDP x TP and TP)

For each layout the normal loop (prepare, backward, optimizer.step) trains a
small model with a tensor-parallel plan; every process also trains a plain
copy on the same global batches (what one process would do) and compares the
gathered parameters. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.parallelism_config import ParallelismConfig
from hasten.strategies.parallel import apply_tensor_parallel

STEPS, BATCH, WIDTH = 4, 2, 8
warnings.filterwarnings("ignore", message="Slicing a flattened dim")  # torch's, on mesh["dp"] (Accelerate's spelling)
PLAN = {"layers.*.up_proj": "colwise", "layers.*.down_proj": "rowwise"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up_proj = torch.nn.Linear(WIDTH, 16)
        self.down_proj = torch.nn.Linear(16, WIDTH)

    def forward(self, x):
        return x + self.down_proj(torch.relu(self.up_proj(x)))


class Net(torch.nn.Module):
    _tp_plan = PLAN  # as transformers models carry theirs

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, WIDTH, generator=generator), torch.randn(n, 1, generator=generator),
                         torch.arange(n))


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def reference(dp: int, steps: int) -> dict:
    """One process, global batch dp * BATCH, the same first `steps` batches."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, (x, y, _) in enumerate(DataLoader(data(), batch_size=dp * BATCH)):
        if step == steps:
            break
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}


def build(sizes: dict):
    sizes = dict(sizes)
    presplit = sizes.pop("presplit", False)
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(**sizes))
    torch.manual_seed(0)
    model = Net()
    if presplit:  # split before prepare, on the accelerator's mesh (as transformers' tp_plan="auto" does)
        apply_tensor_parallel(model, accelerator.torch_device_mesh["tp"], PLAN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(data(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def train(accelerator, model, optimizer, loader, steps: int, seen: list) -> None:
    for step, (x, y, index) in enumerate(loader):
        if step == steps:
            break
        seen.append(index.tolist())
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def param_diff(model, expected: dict) -> float:
    got = {n: full(p.detach()) for n, p in model.named_parameters()}
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    return max((got[n] - expected[n]).abs().max().item() for n in expected)


def layout(sizes: dict) -> dict:
    started = time.perf_counter()
    accelerator, model, optimizer, loader = build(sizes)
    config = accelerator.parallelism_config
    mesh = accelerator.torch_device_mesh
    dp = config.dp_replicate_size * config.dp_shard_size
    seen: list = []
    train(accelerator, model, optimizer, loader, STEPS, seen)
    out = {"distributed_type": accelerator.distributed_type.value, "dims": list(mesh.mesh_dim_names),
           "flat": flattened(mesh),
           "seen": seen, "diff": param_diff(accelerator.unwrap_model(model), reference(dp, STEPS)),
           "dtensors": sum(type(p).__name__ == "DTensor" for p in model.parameters())}
    if config.tp_size > 1:
        out["tp_rank"] = accelerator.tensor_parallel_rank
    # evaluation: every sample once in gather_for_metrics, the last batch cut to the remainder
    eval_loader = accelerator.prepare(DataLoader(data(10), batch_size=BATCH))
    gathered, objects = [], []
    for _, _, index in eval_loader:
        gathered += accelerator.gather_for_metrics(index).tolist()
        objects += accelerator.gather_for_metrics([f"s{i}" for i in index.tolist()])  # through gather_object
    out["gathered"], out["objects"] = gathered, objects
    out["seconds"] = time.perf_counter() - started
    return out


def flattened(mesh) -> dict:
    """The sizes of Accelerate's flattened views that `mesh[name]` finds (as a user script reads them)."""
    sizes = {}
    for name in ("dp", "dp_shard_cp", "dp_cp"):
        try:
            sizes[name] = mesh[name].size()
        except KeyError:
            pass
    return sizes


def resume(sizes: dict, directory: Path) -> dict:
    """Train 2 steps, save_state; a fresh Accelerator/model/optimizer loads it and trains 2 more."""
    accelerator, model, optimizer, loader = build(sizes)
    train(accelerator, model, optimizer, loader, 2, [])
    accelerator.save_state(str(directory))
    accelerator.wait_for_everyone()
    accelerator, model, optimizer, loader = build(sizes)
    accelerator.load_state(str(directory))
    seen: list = []
    # as under Accelerate, a plain loader starts its pass again: skip what the saved run consumed
    train(accelerator, model, optimizer, accelerator.skip_first_batches(loader, 2), 2, seen)
    config = accelerator.parallelism_config
    dp = config.dp_replicate_size * config.dp_shard_size
    return {"diff": param_diff(accelerator.unwrap_model(model), reference(dp, 4)), "seen": seen}


def refused_split() -> str:
    """A model split over tp=2 (on a dp_shard=2 x tp=2 mesh), prepared under tp_size=4: Accelerate refuses it too."""
    first = Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    torch.manual_seed(0)
    model = apply_tensor_parallel(Net(), first.torch_device_mesh["tp"], PLAN)
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=4))
    try:
        accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return "prepared"


LAYOUTS = {
    2: {"dp_shard=2": {"dp_shard_size": 2}, "dp_replicate=2": {"dp_replicate_size": 2}, "tp=2": {"tp_size": 2}},
    4: {"dp_shard=4": {"dp_shard_size": 4}, "dp_replicate=4": {"dp_replicate_size": 4},
        "hsdp=2x2": {"dp_replicate_size": 2, "dp_shard_size": 2}, "dp_shard=2,tp=2": {"dp_shard_size": 2, "tp_size": 2},
        "tp=4": {"tp_size": 4}, "split before prepare": {"dp_shard_size": 2, "tp_size": 2, "presplit": True},
        "dp_replicate=2,tp=2": {"dp_replicate_size": 2, "tp_size": 2}},
}
RESUMED = {4: ["hsdp=2x2", "dp_shard=2,tp=2", "tp=4"]}


def main(out: Path) -> None:
    first = Accelerator(cpu=True)
    world, rank = first.num_processes, first.process_index
    result: dict = {"rank": rank, "layouts": {}, "resumed": {}}
    for name, sizes in LAYOUTS[world].items():
        result["layouts"][name] = layout(sizes)
    for name in RESUMED.get(world, []):
        result["resumed"][name] = resume(LAYOUTS[world][name], out / f"ckpt-{name}")
    if world == 4:
        result["refused_split"] = refused_split()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    first.wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
