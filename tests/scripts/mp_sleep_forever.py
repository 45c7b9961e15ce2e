"""Create an Accelerator, report ready, then sleep (to be stopped by a signal to the launcher).

Usage: mp_sleep_forever.py OUT_DIR TOKEN

Each rank writes OUT_DIR/ready.rank{R} holding its pid once the process
group is up (a collective has succeeded), then sleeps 300 s. TOKEN is
unused by the script: it only makes the ranks' command lines findable in
/proc, so a test can tell whether any rank outlived its launcher.
"""

import os
import sys
import time
from pathlib import Path

import torch

from hasten import Accelerator


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(cpu=True)
    accelerator.gather(torch.tensor([accelerator.process_index]))  # every rank is connected
    # written then renamed: the test polls for the name and must never read an empty file
    ready = out_dir / f"ready.rank{accelerator.process_index}"
    partial = out_dir / f".{ready.name}.tmp"
    partial.write_text(str(os.getpid()))
    partial.rename(ready)
    time.sleep(300)
    (out_dir / f"finished.rank{accelerator.process_index}").write_text("yes")


if __name__ == "__main__":
    main()
