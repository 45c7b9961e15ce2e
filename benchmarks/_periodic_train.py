"""The cost of hasten's periodic asynchronous checkpoints, measured inside one 2-process DDP run (benchmarks/elastic.py).

usage: _periodic_train.py OUT_DIR ROUNDS STEPS EVERY

Rounds alternate: STEPS training steps with periodic checkpoints every EVERY optimizer steps
(`ProjectConfiguration(save_every_n_steps=EVERY)`: in the background, at the boundary after the step), and the
same STEPS without; besides the wall clock, each round's CPU seconds over both processes (the training threads',
and all threads'). EVERY/2 untimed steps come first, so each round's saves fall in its middle (steps EVERY/2,
3 EVERY/2, ...) and the last one's background write has EVERY/2 steps of its own round to finish in, instead of
spilling into the next round (without saves), which would move its cost there. Each process times its steps; the
main process prints one JSON line per round. The model is
an MLP of about 6M parameters (75 MB with its AdamW state), the step about 75 ms on one thread.

The saves' own time is accounted too (`Accounting`): the seconds each save takes on the training thread (the
`save_state` call at the boundary, and the next optimizer step's wait for the parameters' copy) and the CPU seconds
of its background threads (the writer, the hashing helper). A wall-clock ratio on this shared VM varies by about
10 % a round; these are steady, and say what the saves cost with a core free for the writer (the training path
only) and with every core busy training (the writer's CPU taken from training too).
"""

import threading

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import background, integrity, snapshot
from hasten.checkpointing.periodic import PeriodicSaves


class Accounting:
    """Seconds the saves take on the training thread, and CPU seconds on their background threads (this process)."""

    def __init__(self) -> None:
        self.training = self.background = self.waiting = 0.0
        self._lock = threading.Lock()
        wait_for_copy, run_in_background, hash_file = snapshot.wait_for_copy, background.run_in_background, \
            integrity.hash_file

        def timed_wait() -> None:  # (the optimizer step's pre-hook calls the module's function by name)
            start = time.perf_counter()
            wait_for_copy()
            self.waiting += time.perf_counter() - start
            self.training += time.perf_counter() - start

        def counted(work):
            def run() -> None:
                start = time.thread_time()
                try:
                    work()
                finally:
                    self._add(time.thread_time() - start)
            return run

        def counted_hash(*args, **kwargs):
            start = time.thread_time()
            try:
                return hash_file(*args, **kwargs)
            finally:
                self._add(time.thread_time() - start)

        snapshot.wait_for_copy = timed_wait
        background.run_in_background = lambda target, work: run_in_background(target, counted(work))
        integrity.hash_file = counted_hash

    def _add(self, seconds: float) -> None:
        with self._lock:
            self.background += seconds

    def timed(self, save):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                self.training += time.perf_counter() - start
        return call


def main() -> None:
    out, rounds, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        out, automatic_checkpoint_naming=True, total_limit=2, save_every_n_steps=every))
    watch = accelerator._boundary_watch  # the benchmark switches the periodic policy on and off between rounds
    accounting = Accounting()
    policy, saver = watch.periodic, accounting.timed(watch.save_periodic)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = TensorDataset(torch.randn(64 * steps * 2, 1024), torch.randn(64 * steps * 2, 1))
    loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    watch.periodic, watch.save_periodic = None, None
    for _ in range(every // 2):  # untimed: the timed rounds then start half an interval before a save
        step()
    for round_number in range(rounds * 2):
        with_saves = round_number % 2 == 0  # alternate, starting with saves (the first also warms up both)
        watch.periodic = PeriodicSaves(every_steps=every) if with_saves else None
        watch.save_periodic = saver if with_saves else None
        start, main_cpu, process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        training, writing, waiting = accounting.training, accounting.background, accounting.waiting
        for _ in range(steps):
            step()
        accelerator.wait_for_everyone()
        seconds = time.perf_counter() - start
        # CPU seconds over both processes: the training thread's own (what the save adds to the training path) and
        # every thread's (the writer's too: what it takes from training where no core is idle); steadier than the
        # wall clock on a shared VM, whose rounds vary +-10 %
        cpu = accelerator.reduce(torch.tensor([time.thread_time() - main_cpu, time.process_time() - process_cpu,
                                               accounting.background - writing], dtype=torch.float64), "sum").tolist()
        # the processes step together: a save that holds one training thread up holds the step up (the slowest)
        on_path, waited = accelerator.reduce(torch.tensor([accounting.training - training, accounting.waiting - waiting],
                                                          dtype=torch.float64), "max").tolist()
        if accelerator.is_main_process:
            print(json.dumps({"round": round_number // 2, "saves": with_saves, "seconds": seconds, "steps": steps,
                              "main_cpu": cpu[0], "process_cpu": cpu[1], "save_training_s": on_path, "save_copy_wait_s": waited,
                              "save_background_cpu_s": cpu[2]}), flush=True)
    watch.periodic = policy
    accelerator.end_training()


if __name__ == "__main__":
    main()
