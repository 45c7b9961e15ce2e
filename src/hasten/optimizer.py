"""Accelerate's ``accelerate.optimizer`` path: names only; the code lives in `hasten.runtime.optimizer`.

Example:
    >>> import torch
    >>> from hasten.optimizer import AcceleratedOptimizer
    >>> param = torch.nn.Parameter(torch.ones(1))
    >>> opt = AcceleratedOptimizer(torch.optim.SGD([param], lr=0.1))
    >>> param.grad = torch.ones(1); opt.step(); param.data
    tensor([0.9000])
"""

from __future__ import annotations

from .runtime.optimizer import AcceleratedOptimizer, OptimizerSteps, move_to_device, patch_optimizer_step

__all__ = ["AcceleratedOptimizer", "OptimizerSteps", "move_to_device", "patch_optimizer_step"]
