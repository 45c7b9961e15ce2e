"""Accelerate's ``accelerate.inference`` module path: pipelined inference with :func:`prepare_pippy`.

The code lives in `hasten.strategies.parallel.pipeline` (`prepare_pippy`) and `.pippy` (the helpers it is
made of in Accelerate: `generate_device_map`, `find_pippy_batch_size`, `build_pipeline`, `pippy_forward`).

Example:
    >>> import torch
    >>> from hasten import debug_launcher, PartialState
    >>> from hasten.inference import prepare_pippy
    >>> def infer():  # in each of 2 processes: one stage each
    ...     PartialState(cpu=True)
    ...     model, batch = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), torch.randn(4, 8)
    ...     model = prepare_pippy(model, split_points="auto", example_args=(batch,), gather_output=True)
    ...     assert model(batch).shape == (4, 2)
    >>> debug_launcher(infer, num_processes=2)
"""

from .strategies.parallel.pipeline import auto_split_points, prepare_pippy
from .strategies.parallel.pippy import build_pipeline, find_pippy_batch_size, generate_device_map, pippy_forward

__all__ = ["auto_split_points", "build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward",
           "prepare_pippy"]
