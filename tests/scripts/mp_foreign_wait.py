"""Rank 0 and rank 1 wait in different places, one of them in a collective hasten did not start.

usage: mp_foreign_wait.py MODE
  barrier     rank 0 in accelerator.gather, rank 1 in a plain dist.barrier()        (deadlock)
  all_reduce  rank 0 in accelerator.gather (3 values), rank 1 in dist.all_reduce of 5  (deadlock)
  ddp         rank 0 in accelerator.gather, rank 1 in DDP's backward (its all-reduce)  (deadlock)
  compute     rank 1 computes for ~8 s while rank 0 waits in dist.barrier()           (slow, not a deadlock)

The lines where each rank waits end in a ``# WAIT:<mode>:<rank>`` marker the test looks up; before a deadlock
each rank prints ``WAITING <rank> <time.time()>``, so the test can time the report from the moment both wait.
The group's timeout is the default 30 minutes: only the watchdog can end a deadlock here.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from hasten import Accelerator

mode = sys.argv[1]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
model = accelerator.prepare(nn.Linear(4, 1))
accelerator.wait_for_everyone()

if mode == "compute":
    if rank == 1:
        started, x = time.monotonic(), torch.randn(256, 256)
        while time.monotonic() - started < 8:  # four times the watchdog's 2 s window for a verdict
            x = torch.tanh(x @ x / 256)
    dist.barrier()  # WAIT:compute:0
    print(f"DONE {rank}", flush=True)
    accelerator.end_training()
else:
    print(f"WAITING {rank} {time.time()}", flush=True)
    if rank == 0:
        accelerator.gather(torch.ones(3))  # WAIT:any:0
    elif mode == "barrier":
        dist.barrier()  # WAIT:barrier:1
    elif mode == "all_reduce":
        dist.all_reduce(torch.ones(5))  # WAIT:all_reduce:1
    elif mode == "ddp":
        accelerator.backward(model(torch.ones(2, 4)).sum())  # WAIT:ddp:1
    print("UNREACHABLE", flush=True)
