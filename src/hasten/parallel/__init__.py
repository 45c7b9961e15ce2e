"""Model parallelism: tensor parallel (:mod:`.tensor`) and pipeline parallel (:mod:`.pipeline`).

Example:
    >>> from hasten.parallel import apply_tensor_parallel, prepare_pipeline_training, prepare_pippy
"""

from .pipeline import PipelineTrainer, auto_split_points, prepare_pipeline_training, prepare_pippy
from .tensor import apply_tensor_parallel, expand_tp_plan, model_tp_plan, tp_style

__all__ = ["PipelineTrainer", "apply_tensor_parallel", "auto_split_points", "expand_tp_plan", "model_tp_plan",
           "prepare_pipeline_training", "prepare_pippy", "tp_style"]
