"""Faults of liveness: a rank that freezes, a rank that leaves early, a rank that is only slow.

Usage: mp_liveness.py MODE OUT_DIR TOKEN [SECONDS]

- freeze: every rank gathers in a loop; after a few steps each writes OUT_DIR/ready.rank{R} (its pid),
  and the test stops one with SIGSTOP. With GROUP_TIMEOUT set, the process group's timeout is that many seconds.
- leave-gather / leave-barrier: rank 1 returns from main (printing "LEFT <time>") while rank 0 goes on to a
  gather / to wait_for_everyone; neither can ever complete.
- end-gather: rank 1 calls end_training while rank 0 goes on to a gather it can never complete.
- slow: rank 1 sleeps SECONDS, then computes for about SECONDS holding the GIL (one long C call: its
  heartbeat thread cannot run), while rank 0 waits in a gather; then both finish and print DONE.
TOKEN is unused: it makes the ranks' command lines findable in /proc.
"""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from hasten import Accelerator, InitProcessGroupKwargs


def gil_held_for(seconds: float) -> None:
    """Compute in one C call that never lets another thread run (builtin sum over a range)."""
    start = time.monotonic()
    sum(range(10**7))  # calibrate on this machine
    per_item = (time.monotonic() - start) / 10**7
    sum(range(int(seconds / per_item)))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 15.0
    timeout = float(os.environ.get("GROUP_TIMEOUT", "0"))
    handlers = [InitProcessGroupKwargs(timeout=timedelta(seconds=timeout))] if timeout else None
    accelerator = Accelerator(cpu=True, kwargs_handlers=handlers)
    rank = accelerator.process_index
    out.mkdir(parents=True, exist_ok=True)
    accelerator.gather(torch.ones(1))  # every rank is connected
    if mode == "freeze":
        for step in range(100_000):
            accelerator.gather(torch.ones(1))
            if step == 5:
                (out / f"ready.rank{rank}").write_text(str(os.getpid()))
            time.sleep(0.05)
        return
    if mode == "end-gather":  # rank 1 ends training (its process group) while rank 0 goes on to a gather
        if rank == 1:
            print(f"LEFT {time.time():.3f}", flush=True)
            accelerator.end_training()
            return
        accelerator.gather(torch.ones(3))  # WAIT:endgather
        print("UNREACHABLE", flush=True)
        return
    if mode.startswith("leave"):
        if rank == 1:
            print(f"LEFT {time.time():.3f}", flush=True)
            return
        if mode == "leave-barrier":
            accelerator.wait_for_everyone()  # WAIT:barrier
        accelerator.gather(torch.ones(3))  # WAIT:gather
        print("UNREACHABLE", flush=True)
        return
    if mode == "slow":
        if rank == 1:
            time.sleep(seconds)
            gil_held_for(seconds)
        accelerator.gather(torch.ones(2))
        print(f"DONE {rank}", flush=True)


if __name__ == "__main__":
    main()
