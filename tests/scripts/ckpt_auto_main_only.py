"""Automatic naming with total_limit=2: three saves on the main process only, then one on every process, then a resume.

usage: ckpt_auto_main_only.py OUT_DIR — each rank writes OUT_DIR/rank<R>.json (paths, iterations, what loaded).
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator
from hasten.utils import ProjectConfiguration

out = Path(sys.argv[1])
config = ProjectConfiguration(out / "project", automatic_checkpoint_naming=True, total_limit=2)
accelerator = Accelerator(cpu=True, project_config=config)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
report = {"main_only": []}
for _ in range(3):
    loss = model(torch.ones(2, 3)).sum()
    accelerator.backward(loss)  # DDP's all-reduce: where the other process waits while the main one saves
    optimizer.step()
    optimizer.zero_grad()
    if accelerator.is_main_process:
        report["main_only"].append(accelerator.save_state())
report["iteration_before_all"] = accelerator.save_iteration
report["all"] = accelerator.save_state()
report["iteration_after_all"] = accelerator.save_iteration
report["listed"] = sorted(p.name for p in (out / "project" / "checkpoints").iterdir())
accelerator.wait_for_everyone()
report["loaded"] = accelerator.load_state()
report["iteration_after_load"] = accelerator.save_iteration
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
accelerator.end_training()
