"""Accelerate's ``accelerate.inference`` module path: pipelined inference with :func:`prepare_pippy`.

The code lives in `hasten.strategies.parallel.pipeline`.

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

__all__ = ["auto_split_points", "prepare_pippy"]
