"""Runtime facts a launched process must see. Writes rank{N}.json into argv[1].

Modes (argv[2]):
  facts      - world size, OMP threads, launch spec reached the process
  adopt      - the user creates the process group first; hasten adopts it
  debug      - gather with mismatched shapes under --debug raises one clear error
  forget     - never calls end_training; an earlier-registered atexit hook checks
               that hasten left the process group for us
"""

import atexit
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

out_dir, mode = Path(sys.argv[1]), sys.argv[2]
result = {}


def write():
    rank = int(os.environ["RANK"])
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if mode == "forget":
    # Registered before hasten's own hook, so it runs after it (atexit is LIFO).
    def check_left_group():
        result["group_destroyed_at_exit"] = not dist.is_initialized()
        write()

    atexit.register(check_left_group)

if mode == "adopt":
    dist.init_process_group("gloo")
    group_before = dist.group.WORLD

from hasten import Accelerator  # noqa: E402

accelerator = Accelerator()
result.update(
    world_size=accelerator.num_processes,
    rank=accelerator.process_index,
    distributed_type=accelerator.distributed_type.value,
    omp_threads=os.environ.get("OMP_NUM_THREADS"),
    mixed_precision=accelerator.mixed_precision,
    device=str(accelerator.device),
)
if mode == "adopt":
    result["same_group"] = dist.group.WORLD is group_before
    result["sum"] = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0])).item()
if mode == "debug":
    try:
        accelerator.gather(torch.zeros(2 + accelerator.process_index, 3))
    except ValueError as error:
        result["error"] = str(error)
if mode != "forget":
    write()
    accelerator.end_training()
