"""3 processes: hasten's reduce of floats is bit for bit torch.distributed's all-reduce (the order floats are summed in)."""
import json
import os
import sys

import torch
import torch.distributed as dist

from hasten import Accelerator

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
# 1e8, 1 and -1e8 (one per rank): in float32 (1e8 + 1) - 1e8 is 0 but (1e8 - 1e8) + 1 is 1, so each element's
# result says in which order it was summed; gloo splits 12 elements into chunks summed starting at different ranks
values = torch.full((12,), (1e8, 1.0, -1e8)[rank % 3], dtype=torch.float32)
raw = values.clone()
dist.all_reduce(raw)
ours = accelerator.reduce(values, "sum")
ints = accelerator.reduce(torch.tensor([rank, 2 * rank]), "sum")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"raw": [v.hex() for v in raw.tolist()], "ours": [v.hex() for v in ours.tolist()],
               "ints": ints.tolist()}, f)
