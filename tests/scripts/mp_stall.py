"""Rank 1 computes for a long time while rank 0 waits in a gather: a plain stall, reported at the timeout."""

import time
from datetime import timedelta

import torch

from hasten import Accelerator, InitProcessGroupKwargs

accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=8))])
if accelerator.process_index == 1:
    time.sleep(30)
accelerator.gather(torch.ones(2))
print("UNREACHABLE", flush=True)
