"""What `from hasten import Accelerator` loads: only what a training script needs at that moment.

Import time is a feature (benchmarks/overhead.py measures it against `import torch`); this guards it by
what is in `sys.modules` after the import, in a fresh interpreter, not by a clock.
"""

from __future__ import annotations

import json
import subprocess
import sys

# Loaded only when used: big-model loading and offload, the trackers, the data layer (first prepare), the sharded
# engines, launching and the CLI, checkpoint writing, and the optional libraries.
NOT_AT_IMPORT = [
    "hasten.big_modeling.loading", "hasten.big_modeling.offload", "hasten.big_modeling.device_map",
    "hasten.big_modeling.hooks", "hasten.big_modeling.model_helpers", "hasten.big_modeling.dispatch",
    "hasten.tracking", "hasten.data", "hasten.strategies.fsdp", "hasten.strategies.deepspeed",
    "hasten.strategies.parallel.mesh", "hasten.launch", "hasten.cli", "hasten.checkpointing.save",
    "hasten.checkpointing.load", "hasten.utils", "hasten.facade.elastic", "hasten.process.elastic",
    "hasten.checkpointing.periodic", "hasten.checkpointing.preemption", "transformers", "deepspeed", "torchao", "safetensors.torch",
    "tensorboard", "wandb", "mlflow", "accelerate", "packaging",
]


def _loaded_after(statement: str) -> list[str]:
    code = (f"import sys, json, torch\nbefore = set(sys.modules)\n{statement}\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_from_hasten_import_accelerator_loads_only_what_a_script_needs_then():
    loaded = _loaded_after("from hasten import Accelerator")
    present = sorted({name for name in loaded for prefix in NOT_AT_IMPORT
                      if name == prefix or name.startswith(prefix + ".")})
    assert not present, f"`from hasten import Accelerator` imports modules a script does not need yet: {present}"
    assert "hasten.accelerator" in loaded  # the check sees what the import loads


def test_an_accelerator_without_trackers_or_loaders_still_loads_none_of_them():
    loaded = _loaded_after("from hasten import Accelerator\nAccelerator(cpu=True)")
    made_then = ("hasten.checkpointing.periodic", "hasten.checkpointing.preemption")  # the batch-boundary watch
    present = sorted({name for name in loaded for prefix in NOT_AT_IMPORT if prefix not in made_then
                      if name == prefix or name.startswith(prefix + ".")})
    assert not present, f"Accelerator() imports: {present}"
