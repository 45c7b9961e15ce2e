"""Real faults around automatic checkpoints: a flipped bit, a full disk, a file-size limit, a directory not writable.

usage: ckpt_faults.py OUT PROJECT MODE [ARG [ENGINE]]     ENGINE: ddp (default) | fsdp (FSDP2) | deepspeed (ZeRO-2)
  bitflip FILE    save checkpoint_0 and checkpoint_1, flip one bit of checkpoint_1/FILE, load_state() (must refuse
                  and change nothing), then load_state() with fallback_on_damage=True (must load checkpoint_0)
  efbig RANKS     save checkpoint_0, then save with RLIMIT_FSIZE at 1 KiB on RANKS (comma-separated; SIGXFSZ is
                  ignored, so write raises EFBIG), then load_state(), then save again without the limit
  enospc          PROJECT is a small filesystem: save checkpoint_0, fill the disk (main process), save, load_state(),
                  free the disk, save again
  eacces          save checkpoint_0, make the checkpoints folder read-only, save, load_state(), make it writable, save

The write faults use total_limit=1, so a rotation that ran before the new checkpoint was complete would delete the
only good one (bitflip keeps 2, to have one to fall back to). Each rank writes OUT/rank<R>.json: what each step raised and found.
"""

import json
import logging
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration, set_seed

out, project, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
arg = sys.argv[4] if len(sys.argv) > 4 else ""
engine = sys.argv[5] if len(sys.argv) > 5 else "ddp"
set_seed(0)
plugins = {}
if engine == "fsdp":
    from hasten import FullyShardedDataParallelPlugin

    plugins["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)  # FSDP2: sharded checkpoints
if engine == "deepspeed":
    from hasten.utils.deepspeed import DeepSpeedPlugin

    plugins["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=2)
accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
    project, automatic_checkpoint_naming=True, total_limit=2 if mode == "bitflip" else 1), **plugins)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
data = TensorDataset(torch.randn(64, 32, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1))
loader = DataLoader(data, batch_size=4, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
rank = accelerator.process_index
root = project / "checkpoints"
report: dict = {"rank": rank}
batches = iter(loader)


def step() -> None:
    x, y = next(batches)
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def params() -> list[list[float]]:
    """Every parameter, whole (an FSDP shard is gathered: every rank calls this at the same points)."""
    return [getattr(p, "full_tensor", lambda: p)().detach().flatten().tolist() for p in model.parameters()]


def state() -> dict:
    """Everything load_state may change: weights, optimizer, scheduler, RNG (compared before and after a refusal)."""
    return {"params": params(), "optimizer": repr(optimizer.state_dict().get("state")), "lr": scheduler.get_last_lr(),
            "rng": torch.get_rng_state().tolist()}


def attempt(name: str, call) -> None:
    start = time.monotonic()
    try:
        report[name] = {"result": str(call())}
    except Exception as error:  # noqa: BLE001 - the test reads what was raised
        report[name] = {"error": type(error).__name__, "message": str(error)}
    report[name]["seconds"] = time.monotonic() - start
    report[name]["checkpoints"] = sorted(p.name for p in root.iterdir()) if root.is_dir() else []


step()
first = accelerator.save_state()
at_first = params()
step()

if mode == "bitflip":
    second = Path(accelerator.save_state())
    if accelerator.is_main_process:
        with open(second / arg, "r+b") as file:  # one bit, in the middle of the file
            file.seek(file.seek(0, 2) // 2)
            byte = file.read(1)[0]
            file.seek(-1, 1)
            file.write(bytes([byte ^ 0x10]))
    accelerator.wait_for_everyone()
    step()  # live state moves on, so a load that changed anything would show
    before = state()
    attempt("load", accelerator.load_state)
    report["unchanged"] = state() == before
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("hasten").addHandler(handler)
    accelerator.project_configuration.fallback_on_damage = True
    attempt("fallback", accelerator.load_state)
    report["warnings"] = warnings
    report["equal_to_first"] = params() == at_first
    attempt("save_after", accelerator.save_state)
else:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    filler = project / "filler"
    if mode == "efbig" and str(rank) in arg.split(","):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as Python does at start-up: write then raises EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limit[1]))
    if mode == "enospc" and accelerator.is_main_process:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)  # until the disk refuses (ENOSPC): it is full now
        except OSError:
            pass
        finally:
            os.close(fd)
    if mode == "eacces":
        root.chmod(0o555)
    accelerator.wait_for_everyone()
    attempt("save", accelerator.save_state)
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    report["staging_left"] = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
    attempt("load", accelerator.load_state)
    report["equal_to_first"] = params() == at_first
    accelerator.wait_for_everyone()
    if mode == "enospc" and accelerator.is_main_process:
        filler.unlink()
    if mode == "eacces":
        root.chmod(0o755)
    accelerator.wait_for_everyone()
    attempt("save_after", accelerator.save_state)
report["first"] = first
(out / f"rank{rank}.json").write_text(json.dumps(report))
accelerator.wait_for_everyone()
accelerator.end_training()
