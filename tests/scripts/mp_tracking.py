"""Logging and trackers on every process of a launch. argv[1]: output directory (trackers write there)."""

import logging
import sys

import torch

from hasten import Accelerator
from hasten.logging import get_logger

logging.basicConfig(format="%(levelname)s %(message)s", stream=sys.stdout)
logger = get_logger("mp_tracking", log_level="INFO")  # before any Accelerator: the rank comes from the environment
logger.info("before the accelerator")

out = sys.argv[1]
accelerator = Accelerator(log_with=["jsonl", "csv", "tensorboard", "mlflow", "wandb"], project_dir=out)
logger.info("main only")
logger.info("every process", main_process_only=False)
logger.info("in order", in_order=True)
logger.debug("too detailed")
logger.warning_once("once")
logger.warning_once("once")
accelerator.init_trackers("tracked", config={"lr": 0.01, "layers": 3, "optimizer": "adamw"},
                          init_kwargs={"wandb": {"mode": "offline", "dir": out}})
for step in range(4):
    loss = torch.tensor(1.0 / (step + 1))
    accelerator.log({"loss": loss, "rank_seen": float(accelerator.process_index)}, step=step)
accelerator.get_tracker("tensorboard", unwrap=True).add_scalar("direct", 5.0, 0) if accelerator.is_main_process else None
accelerator.end_training()
print(f"DONE {accelerator.process_index}", flush=True)
