"""Names of model weight files, as Accelerate and transformers write them (one file, or shards and an index).

`load_checkpoint_in_model` looks for them; the checkpoint layer writes a
model under the same names (`hasten.checkpointing.constants` re-exports them).

Example:
    >>> from hasten.big_modeling.filenames import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_PATTERN_NAME
    >>> SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002")
    ('model.safetensors.index.json', 'model-00001-of-00002.safetensors')
"""

__all__ = ["MODEL_NAME", "SAFE_MODEL_NAME", "WEIGHTS_NAME", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
           "SAFE_WEIGHTS_INDEX_NAME", "WEIGHTS_PATTERN_NAME", "SAFE_WEIGHTS_PATTERN_NAME"]

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
