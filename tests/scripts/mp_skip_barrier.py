"""Rank 1 skips a barrier and goes on to a gather: a certain deadlock, with the default 30-minute timeout."""

import torch

from hasten import Accelerator

accelerator = Accelerator()
if accelerator.process_index == 0:
    accelerator.wait_for_everyone()  # rank 0 waits here ...
accelerator.gather(torch.ones(3))  # ... while rank 1 is already here
print("UNREACHABLE", flush=True)
