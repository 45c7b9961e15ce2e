"""Rank 1 raises ValueError("boom"); rank 0 is either blocked in a collective or busy computing.

Usage: mp_rank_raises.py OUT_DIR {barrier|busy}

barrier: rank 0 waits at a barrier that never completes (gloo then reports
         the lost peer to it).
busy:    rank 0 is not in any collective (sleeps 90 s), so only the launcher
         can stop it.
Rank 0 writes OUT_DIR/rank0_reached_barrier (or rank0_busy) first. If the
launcher did not stop the healthy rank, the run would hang (the process
group timeout is 30 minutes) or last 90 s.
"""

import sys
import time
from pathlib import Path

import torch

from hasten import Accelerator


def fail_on_rank_one(rank: int) -> None:
    if rank == 1:
        time.sleep(0.5)  # let rank 0 reach its waiting point first
        raise ValueError("boom")


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    out_dir.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    accelerator.gather(torch.tensor([rank]))  # both ranks are up and connected
    fail_on_rank_one(rank)
    if mode == "busy":
        (out_dir / f"rank{rank}_busy").write_text("yes")
        time.sleep(90)
        (out_dir / f"rank{rank}_done").write_text("yes")
        return
    (out_dir / f"rank{rank}_reached_barrier").write_text("yes")
    accelerator.wait_for_everyone()
    (out_dir / f"rank{rank}_done").write_text("yes")


if __name__ == "__main__":
    main()
