"""Model parallelism over one named device mesh, one concept a module.

- `mesh.py`: `ParallelismConfig`, the N-D sizes (dp_replicate x dp_shard x cp x tp) and the `DeviceMesh` they
  describe (the peer's path for it is `hasten.parallelism_config`);
- `tensor.py`: `apply_tensor_parallel` (`parallelize_module` by a plan: the user's or the model's `tp_plan`);
- `tp_size.py`: a model's tensor-parallel degree (`get_model_tp_size`), the check against `tp_size`, and the
  older `TorchTensorParallelPlugin`;
- `context.py`: `maybe_context_parallel`'s context (torch's `context_parallel` on CUDA, gathered-KV attention on
  CPU); `context_config.py`: its `TorchContextParallelConfig`;
- `pipeline.py`: `prepare_pippy` (pipelined inference; Accelerate 1.15's `accelerate.inference`, which 1.16 removed:
  hasten keeps it here, under its own path only) and
  `prepare_pipeline_training` (GPipe / 1F1B on `torch.distributed.pipelining`); `pippy.py`: the helpers
  Accelerate's `prepare_pippy` is made of (`build_pipeline`, `pippy_forward`, ...).

The names below are imported on first use, so reading a `ParallelismConfig` does not import torch.

Example:
    >>> from hasten.strategies.parallel import apply_tensor_parallel, prepare_pipeline_training, prepare_pippy
"""

from __future__ import annotations

from ...core.lazy import lazy_exports

_EXPORTS = {
    "ParallelismConfig": "mesh",
    "PipelineTrainer": "pipeline",
    "auto_split_points": "pipeline",
    "prepare_pipeline_training": "pipeline",
    "prepare_pippy": "pipeline",
    "build_pipeline": "pippy",
    "find_pippy_batch_size": "pippy",
    "generate_device_map": "pippy",
    "pippy_forward": "pippy",
    "apply_tensor_parallel": "tensor",
    "expand_tp_plan": "tensor",
    "model_tp_plan": "tensor",
    "tp_style": "tensor",
    "TorchTensorParallelPlugin": "tp_size",
    "check_model_tp_size": "tp_size",
    "get_model_tp_size": "tp_size",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


