"""A finished run must exit 0, every time: a user-created gloo group, extra groups the script still
references at exit, a thread pool still referenced (its worker is not a daemon thread: torchft's manager keeps one,
and a live run's end once waited for it forever), a hasten Accelerator on top, then a normal end. Prints DONE when the
work is done."""

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
world = dist.group.WORLD  # references kept until interpreter teardown, as user scripts do
groups = [dist.new_group(backend="gloo") for _ in range(4)]
for group in groups:
    dist.all_reduce(torch.ones(1), group=group)

from hasten import Accelerator  # noqa: E402

pool = ThreadPoolExecutor(1)
pool.submit(dist.get_rank).result()

accelerator = Accelerator()
total = accelerator.reduce(torch.tensor([1.0 + accelerator.process_index])).item()
assert total == sum(range(1, accelerator.num_processes + 1)), total
accelerator.end_training()
print("DONE", flush=True)
