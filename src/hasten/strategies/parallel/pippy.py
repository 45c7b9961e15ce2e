"""Accelerate's lower-level PiPPy helpers (``accelerate.inference``), under `prepare_pippy`'s own path.

`prepare_pippy` (in `pipeline.py`) is what scripts call; these are the
parts Accelerate's is made of, kept with its signatures and behaviour for
scripts that call them directly: `generate_device_map` (a device map whose
device indices are the stages), `find_pippy_batch_size`, `build_pipeline`
(a GPipe schedule over this process's stage, on ``torch.distributed.pipelining``)
and `pippy_forward` (one pipelined call: the first process feeds the inputs,
the last gets the output). They run on CPU processes (gloo) as on GPUs.

Example:
    >>> import torch
    >>> find_pippy_batch_size((torch.ones(4, 2),), None)
    4
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...big_modeling.device_map import infer_auto_device_map
from ...big_modeling.model_helpers import calculate_maximum_sizes
from ...core.objects import convert_bytes
from ...runtime.operations import copy_tensor_to_devices, ignorant_find_batch_size, pad_input_tensors
from ...runtime.state import PartialState
from .pipeline import _split_annotations

__all__ = ["build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward"]


def generate_device_map(model: torch.nn.Module, num_processes: int = 1, no_split_module_classes: list[str] | None = None,
                        max_memory: dict[Any, Any] | None = None) -> OrderedDict[str, int | str]:
    """A device map putting about ``1 / num_processes`` of `model` on each of the devices ``0 .. num_processes - 1``
    (each gets a tenth more than its share, for shared weights); Accelerate's ``"auto"`` split points are the first
    module of each device after the first.

    Example:
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
        >>> generate_device_map(net)["0"]  # one process: the usual "auto" map (here: the CPU)
        'cpu'
    """
    if num_processes == 1:
        return infer_auto_device_map(model, no_split_module_classes=no_split_module_classes, clean_result=False)
    if max_memory is None:
        model_size, shared = calculate_maximum_sizes(model)
        value, unit = convert_bytes((model_size + shared[0]) / num_processes).split(" ")
        # rounded up to the unit, then a tenth more for shared weights (Accelerate's allowance)
        max_memory = {i: f"{math.ceil(float(value)) * 1.1} {unit}" for i in range(num_processes)}
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                 clean_result=False)


def find_pippy_batch_size(args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> int | None:
    """The batch size of the first positional, else keyword, input that holds a tensor; None when none does.

    Example:
        >>> find_pippy_batch_size(("text",), {"x": torch.ones(3, 1)})
        3
    """
    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def build_pipeline(model: torch.nn.Module, split_points: Sequence[str], args: Sequence[Any],
                   kwargs: dict[str, Any] | None, num_chunks: int) -> Any:
    """Trace `model` on one micro-batch (`args`, `kwargs`), cut it before each split point and return a
    ``ScheduleGPipe`` of `num_chunks` micro-batches over this process's stage (every process calls it).

    Example:
        >>> import hasten
        >>> def run():  # in each of 2 processes
        ...     hasten.PartialState(cpu=True)
        ...     torch.manual_seed(0)
        ...     net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        ...     schedule = build_pipeline(net, ["1"], (torch.ones(1, 4),), None, num_chunks=2)
        ...     out = pippy_forward(schedule.step, 2, True, torch.ones(2, 4))
        ...     assert torch.allclose(out, net(torch.ones(2, 4)), atol=1e-6)
        >>> hasten.debug_launcher(run, num_processes=2)
    """
    from torch.distributed.pipelining import ScheduleGPipe, pipeline

    state = PartialState()
    with _split_annotations(model, list(split_points)) as split_spec, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch's tracer's noise
        pipe = pipeline(model, mb_args=tuple(args), mb_kwargs=kwargs, split_spec=split_spec)
    # the stage is the process's index in the group (Accelerate takes the local index: the same on one machine)
    return ScheduleGPipe(pipe.build_stage(state.process_index, device=state.device), num_chunks)


def pippy_forward(forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any) -> Any:
    """One pipelined call of `forward` (a schedule's ``step``): the first process feeds the inputs (zero-padded
    when the batch is not `num_chunks` rows, as Accelerate's `pad_input_tensors`), the last returns the output,
    the others None; with `gather_output` every process gets the last one's output. One process: ``forward(...)``.

    Example:
        >>> pippy_forward(lambda x: x * 2, 1, False, torch.ones(2))  # one process
        tensor([2., 2.])
    """
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_local_main_process:
        batch_size = find_pippy_batch_size(args, kwargs)
        if batch_size is None:
            raise ValueError("pippy_forward found no batch size in its inputs; pass at least one tensor with a batch "
                             "dimension.")
        if batch_size != num_chunks:
            args = pad_input_tensors(args, batch_size, num_chunks)
            kwargs = pad_input_tensors(kwargs, batch_size, num_chunks)
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output:
        output = copy_tensor_to_devices(output)
    return output
