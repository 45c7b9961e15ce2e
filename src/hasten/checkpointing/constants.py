"""File names inside a checkpoint directory: Accelerate's, so scripts and tools that look for them find them."""

# The model's weight files: named once with the code that reads them (big_modeling).
from ..big_modeling.filenames import (
    MODEL_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)

OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
LOADER_STATE_NAME = "dl_state_dict.bin"  # a torchdata-backed loader's state_dict (use_stateful_dataloader)
RNG_STATE_NAME = "random_states"
CUSTOM_STATE_NAME = "custom_checkpoint"
GRADIENTS_NAME = "gradients"  # hasten's own: per-process gradients saved mid-accumulation
# hasten's own: the completeness marker, written last, checked before anything is loaded
MANIFEST_NAME = "hasten_checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint_"

__all__ = [name for name in dir() if name.isupper()]
