"""An elastic run whose main process evaluates alone, for long, while the others wait; then it trains until told.

usage: elastic_busy.py OUT_DIR BUSY_SECONDS

On its first start the main process "evaluates" for BUSY_SECONDS (half a busy CPU loop in Python, half asleep, as
an evaluation, a `save_pretrained` or a push to a hub would) between two `wait_for_everyone()`, while every other
process waits in the second one; a later start (a re-formation of the group) skips it. Then every process trains
a small DDP model, one step every 0.3 s, until one of them sees OUT_DIR/stop. Each process appends JSON lines to
OUT_DIR/events.rank<R>.pid<PID>.jsonl: {"event": "start" | "evaluated" | "step", "world", "restart" (torch's
restart count), "time", ...}; "start" also records the process group's timeout, "evaluated" how long this process
was busy and how long it waited.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator
from hasten.process.group import group_timeout


def main() -> None:
    out, busy = Path(sys.argv[1]), float(sys.argv[2])
    accelerator = Accelerator(cpu=True)
    log = out / f"events.rank{accelerator.process_index}.pid{os.getpid()}.jsonl"

    def record(event: str, **more: float) -> None:
        with log.open("a") as file:
            file.write(json.dumps({"event": event, "rank": accelerator.process_index, "time": time.time(),
                                   "world": accelerator.num_processes,
                                   "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), **more}) + "\n")

    record("start", timeout=group_timeout())
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    evaluated = out / "evaluated"
    if not evaluated.exists():
        accelerator.wait_for_everyone()
        began = time.time()
        if accelerator.is_main_process:
            deadline = began + busy / 2
            while time.time() < deadline:  # Python holding the GIL, handing it over every few milliseconds
                sum(i * i for i in range(10_000))
            time.sleep(busy / 2)
            evaluated.write_text("done")
        busy_for = time.time() - began
        accelerator.wait_for_everyone()
        record("evaluated", busy=busy_for, waited=time.time() - began - busy_for)
    step = 0
    while not accelerator.reduce(torch.tensor([float((out / "stop").exists())]), reduction="sum").item():
        loss = model(torch.randn(4, 8)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        record("step", step=step)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
