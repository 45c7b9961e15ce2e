"""Accelerate's ``accelerate.inference`` module path: pipelined inference with :func:`prepare_pippy`.

The code lives in `hasten.strategies.parallel.pipeline`.

Example:
    >>> from hasten.inference import prepare_pippy
    >>> # model = prepare_pippy(model, split_points="auto", example_args=(batch,), gather_output=True)
"""

from .strategies.parallel.pipeline import auto_split_points, prepare_pippy

__all__ = ["auto_split_points", "prepare_pippy"]
