"""Rank 1 computes for 6 s while rank 0 already waits in a barrier: slow, not a deadlock."""

import time

import torch

from hasten import Accelerator

accelerator = Accelerator()
if accelerator.process_index == 1:
    time.sleep(6)
accelerator.wait_for_everyone()
total = accelerator.reduce(torch.ones(1)).item()
print(f"DONE {total}", flush=True)
