"""Pipeline parallelism on ``torch.distributed.pipelining``: one stage of the model per process.

Two entry points:

* :func:`prepare_pippy` (Accelerate 1.15's name; 1.16 removed it, hasten keeps it
  here): pipelined *inference*; the model's ``forward`` runs a GPipe schedule
  across all processes.
* :func:`prepare_pipeline_training`: pipelined *training*; returns a
  :class:`PipelineTrainer` whose ``step(inputs, target=...)`` runs forward and
  backward of every micro-batch (GPipe or 1F1B) and leaves each process's
  stage parameters with the gradients of the mean loss, ready for an optimizer.

Both trace the model with ``torch.export`` (so ``forward`` must be exportable:
no data-dependent Python control flow) and cut it *before* each split point
module. Every process builds the whole model first and keeps only its stage.

Example:
    >>> import hasten
    >>> def train():  # in each of 2 processes: one stage each
    ...     hasten.PartialState(cpu=True)  # creates the process group
    ...     torch.manual_seed(0)
    ...     model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ...     x, y = torch.randn(8, 4), torch.randn(8, 1)
    ...     trainer = prepare_pipeline_training(model, ["2"], example_args=(x,), loss_fn=torch.nn.functional.mse_loss)
    ...     optimizer = torch.optim.SGD(trainer.parameters(), lr=0.1)
    ...     loss = trainer.step(x, target=y); optimizer.step(); optimizer.zero_grad()
    ...     assert loss.item() > 0  # the batch's mean loss, in every process
    >>> hasten.debug_launcher(train, num_processes=2)
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import MethodType
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

__all__ = ["PipelineTrainer", "auto_split_points", "prepare_pipeline_training", "prepare_pippy"]

SCHEDULES = ("gpipe", "1f1b")


def _param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def auto_split_points(model: torch.nn.Module, num_stages: int,
                      no_split_module_classes: Sequence[str] | None = None) -> list[str]:
    """Choose ``num_stages - 1`` module names that cut `model` into parts of about equal parameter count.

    The model is walked in registration order (assumed to be the order
    ``forward`` runs them, as in ``nn.Sequential`` and transformer layer
    lists); a module bigger than one stage's share (and every ``ModuleList``)
    is opened up into its children unless its class name is in
    `no_split_module_classes`.

    Example:
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
        >>> auto_split_points(net, 2)
        ['2']
    """
    if num_stages < 2:
        return []
    keep_whole = set(no_split_module_classes or ())
    share = _param_count(model) / num_stages

    def blocks(prefix: str, module: torch.nn.Module) -> Iterator[tuple[str, int]]:
        for name, child in module.named_children():
            fqn = f"{prefix}{name}"
            size = _param_count(child)
            # containers are never called themselves, so a cut must go inside them
            container = isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict))
            if (container or (size > share and type(child).__name__ not in keep_whole)) and any(
                    True for _ in child.children()):
                yield from blocks(f"{fqn}.", child)
            else:
                yield fqn, size

    names, sizes = zip(*blocks("", model)) if any(True for _ in model.children()) else ((), ())
    if len(names) < num_stages:
        raise ValueError(f"{type(model).__name__} has only {len(names)} blocks to cut into {num_stages} pipeline "
                         "stages; pass split_points=[...] explicitly or use fewer processes.")
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    cuts: list[int] = []
    for stage in range(1, num_stages):
        lowest = (cuts[-1] + 1) if cuts else 1  # every stage keeps at least one block
        highest = len(names) - (num_stages - stage)
        target = stage * share
        cuts.append(min(range(lowest, highest + 1), key=lambda i: (abs(prefix[i] - target), i)))
    return [names[i] for i in cuts]


@contextlib.contextmanager
def _split_annotations(model: torch.nn.Module, split_points: Sequence[str]) -> Iterator[dict]:
    """``pipeline()``'s split spec; the forwards it patches are restored afterwards so `model` stays usable."""
    from torch.distributed.pipelining import SplitPoint

    saved = {}
    for name in split_points:
        try:
            module = model.get_submodule(name)
        except AttributeError as error:
            raise ValueError(f"split point {name!r} is not a module of {type(model).__name__}; use names from "
                             "model.named_modules().") from error
        saved[name] = (module, module.__dict__.get("forward"))
    try:
        yield {name: SplitPoint.BEGINNING for name in split_points}
    finally:
        for module, forward in saved.values():
            module.__dict__.pop("_orig_forward", None)
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward


def _first_micro_batch(args: tuple, kwargs: dict, num_chunks: int) -> tuple[tuple, dict, int]:
    """The first of `num_chunks` micro-batches of an example batch (what the graph is traced with), and its size."""
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    batch_size = _batch_size(args, kwargs)
    if batch_size is None:
        raise ValueError("the pipeline needs an example batch to trace with; pass example_args=(tensor, ...) "
                         "or example_kwargs={...} shaped like a real batch.")
    if batch_size % num_chunks:
        raise ValueError(f"the example batch size {batch_size} does not divide into num_chunks={num_chunks} "
                         "equal micro-batches; pass an example batch whose size is a multiple of num_chunks.")
    args_split, kwargs_split = split_args_kwargs_into_chunks(args, kwargs, num_chunks)
    return args_split[0], kwargs_split[0], batch_size


def _batch_size(args: tuple, kwargs: dict | None) -> int | None:
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return None


class _Built(NamedTuple):
    stage: Any  # this process's torch PipelineStage
    split_points: list[str]
    num_chunks: int
    batch_size: int  # the traced (whole-batch) size
    out_spec: Any  # pytree spec of forward's output: the last stage returns only its flattened leaves

    def restore_output(self, flat: Any) -> Any:
        """The last stage's flat output (a tensor or a tuple of leaves) in the model's own structure."""
        if self.out_spec is None:
            return flat
        if self.out_spec.num_leaves == 1:
            leaves = [flat[0] if isinstance(flat, (tuple, list)) else flat]
        else:
            leaves = list(flat)
        return pytree.tree_unflatten(leaves, self.out_spec)


@contextlib.contextmanager
def _recording_output_spec(model: torch.nn.Module) -> Iterator[list]:
    """Patch `model.forward` while tracing to record the pytree structure of its output."""
    specs: list = []
    saved = model.__dict__.get("forward")
    original = model.forward

    @functools.wraps(original)  # keeps the signature: the first stage's kwargs come from it
    def forward(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        specs.append(pytree.tree_flatten(output)[1])
        return output

    model.forward = forward
    try:
        yield specs
    finally:
        if saved is None:
            model.__dict__.pop("forward", None)
        else:
            model.forward = saved


def _build_stage(model: torch.nn.Module, split_points: Sequence[str] | str, no_split_module_classes: Any,
                 example_args: tuple, example_kwargs: dict | None, num_chunks: int | None) -> _Built:
    """Trace and cut `model`; keep this process's stage."""
    from torch.distributed.pipelining import pipeline

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("pipeline parallelism needs the process group; create hasten.PartialState() or "
                           "hasten.Accelerator() first.")
    world, rank = dist.get_world_size(), dist.get_rank()
    num_chunks = num_chunks or world
    if split_points == "auto":
        split_points = auto_split_points(model, world, no_split_module_classes)
    split_points = list(split_points)
    if len(split_points) != world - 1:
        raise ValueError(f"{len(split_points)} split points make {len(split_points) + 1} stages but there are "
                         f"{world} processes; pass {world - 1} split points (one stage per process) or 'auto'.")
    example_kwargs = dict(example_kwargs or {})
    mb_args, mb_kwargs, batch_size = _first_micro_batch(tuple(example_args), example_kwargs, num_chunks)
    device = _stage_device(model)
    with _split_annotations(model, split_points) as split_spec, _recording_output_spec(model) as specs, \
            warnings.catch_warnings():
        # torch's own tracer trips its deprecation of LeafSpec checks (once per pytree node): noise for users
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        pipe = pipeline(model, mb_args=mb_args, mb_kwargs=mb_kwargs or None, split_spec=split_spec)
    if pipe.num_stages != world:
        raise ValueError(f"tracing cut {type(model).__name__} into {pipe.num_stages} stages, not {world}; a split "
                         "point must be a module that forward calls exactly once.")
    out_spec = specs[-1] if specs else None
    return _Built(pipe.build_stage(rank, device=device), split_points, num_chunks, batch_size, out_spec)


def _stage_device(model: torch.nn.Module) -> torch.device:
    """Where this process's stage runs: the model's device, or the current GPU when the group speaks NCCL."""
    param = next(model.parameters(), None)
    if dist.get_backend() == "nccl" and (param is None or param.device.type != "cuda"):
        return torch.device("cuda", torch.cuda.current_device())
    return param.device if param is not None and param.device.type != "meta" else torch.device("cpu")


def _pad_batch(value: Any, size: int) -> Any:
    """Pad a tensor's batch dim to `size` by repeating its last row (which stays a valid input, e.g. token ids)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] < size:
        extra = value[-1:].expand(size - value.shape[0], *value.shape[1:])
        return torch.cat([value, extra])
    return value


def _broadcast_from_last(value: Any, device: torch.device) -> Any:
    holder = [value]
    dist.broadcast_object_list(holder, src=dist.get_world_size() - 1,
                               device=device if device.type != "cpu" else None)
    return holder[0]


def prepare_pippy(model: torch.nn.Module, split_points: str | Sequence[str] = "auto",
                  no_split_module_classes: Sequence[str] | None = None, example_args: tuple = (),
                  example_kwargs: dict[str, Any] | None = None, num_chunks: int | None = None,
                  gather_output: bool = False) -> torch.nn.Module:
    """Split `model` into one pipeline stage per process for inference (Accelerate's ``prepare_pippy``).

    Args:
        model: the full model, built with the same weights in every process.
        split_points: module names each stage after the first *starts* with, or ``"auto"`` (balanced
            parameter counts, see :func:`auto_split_points`).
        no_split_module_classes: class names ``"auto"`` must keep inside one stage.
        example_args: a batch shaped like the real ones (only shapes matter); its size
            must be a multiple of `num_chunks`.
        example_kwargs: keyword inputs of that batch, if the model takes any.
        num_chunks: micro-batches per batch (default: the number of processes).
        gather_output: send the output to every process; otherwise only the last process gets it and
            the others get ``None``.

    Returns the same model object, whose ``forward`` now runs the pipeline:
    call it in every process with the same inputs (the first stage reads them,
    the others only their batch size). Smaller batches than the example are
    padded and the padding cut off the output; bigger ones are refused. The
    original forward stays at ``model._original_forward``.

    Example:
        >>> import hasten
        >>> def infer():  # in each of 2 processes
        ...     hasten.PartialState(cpu=True)
        ...     torch.manual_seed(0)
        ...     model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        ...     batch = torch.randn(8, 16)
        ...     expected = model(batch)
        ...     model = prepare_pippy(model, example_args=(torch.randn(8, 16),), gather_output=True)
        ...     with torch.no_grad():
        ...         out = model(batch)  # the whole output, in every process
        ...     assert torch.allclose(out, expected, atol=1e-6)
        >>> hasten.debug_launcher(infer, num_processes=2)
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        setattr(model, "hf_split_points", [])  # one process: nothing to split, forward stays as it is
        return model
    from torch.distributed.pipelining import ScheduleGPipe

    built = _build_stage(model, split_points, no_split_module_classes, tuple(example_args), example_kwargs,
                         num_chunks)
    stage, traced_batch = built.stage, built.batch_size
    schedule = ScheduleGPipe(stage, built.num_chunks)
    original_forward = model.forward

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        batch = _batch_size(args, kwargs) or traced_batch
        if batch > traced_batch:
            raise ValueError(f"the pipeline was traced for batches of {traced_batch}, got {batch}; call "
                             f"prepare_pippy with an example batch of {batch} or split the batch.")
        if stage.is_first:
            args = tuple(_pad_batch(a, traced_batch) for a in args)
            kwargs = {k: _pad_batch(v, traced_batch) for k, v in kwargs.items()}
            output = schedule.step(*args, **kwargs)
        else:
            output = schedule.step()
        if output is not None:
            output = built.restore_output(output)
        if output is not None and batch < traced_batch:  # drop the padding rows
            output = pytree.tree_map(
                lambda t: t[:batch] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, output)
        if gather_output:
            output = _broadcast_from_last(output, stage.device)
        return output

    # nn.Module's __setattr__ is typed for tensors and modules: plain attributes go through setattr.
    for name, value in (("_original_forward", original_forward), ("forward", MethodType(forward, model)),
                        ("pippy_stage", stage), ("pippy_schedule", schedule), ("hf_split_points", built.split_points)):
        setattr(model, name, value)
    return model


class PipelineTrainer:
    """Runs pipelined training steps; this process holds one stage (:attr:`stage_module`).

    Made by :func:`prepare_pipeline_training`. Each :meth:`step` splits the
    batch into micro-batches, runs the schedule's forwards and backwards, and
    leaves the stage's ``.grad`` equal to the gradient of the *mean* loss over
    the batch (as with an unsplit model and a mean-reduced loss). Gradients
    accumulate until the optimizer zeroes them.

    Example:
        >>> import hasten
        >>> def train():  # in each of 2 processes
        ...     hasten.PartialState(cpu=True)
        ...     torch.manual_seed(0)
        ...     model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        ...     loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
        ...     trainer = prepare_pipeline_training(model, "auto", example_args=(loader[0][0],),
        ...                                         loss_fn=torch.nn.functional.mse_loss)
        ...     optimizer = torch.optim.AdamW(trainer.parameters())
        ...     for x, y in loader:
        ...         loss = trainer.step(x, target=y); optimizer.step(); optimizer.zero_grad()
        >>> hasten.debug_launcher(train, num_processes=2)
    """

    def __init__(self, schedule: Any, stage: Any, split_points: list[str], num_chunks: int, batch_size: int) -> None:
        self.schedule = schedule
        self.stage = stage
        self.split_points = split_points
        self.num_chunks = num_chunks
        self.batch_size = batch_size
        #: the per-micro-batch losses of the last step (last stage only; empty elsewhere)
        self.last_losses: list[torch.Tensor] = []

    @property
    def stage_module(self) -> torch.nn.Module:
        """This process's part of the model; its parameter names are the full model's names."""
        return self.stage.submod

    @property
    def is_first_stage(self) -> bool:
        return self.stage.is_first

    @property
    def is_last_stage(self) -> bool:
        return self.stage.is_last

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """This stage's parameters (give them to the optimizer).

        Example:
            >>> import hasten
            >>> def stage_parameters():  # in each of 2 processes
            ...     hasten.PartialState(cpu=True)
            ...     model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)), torch.randn(4, 4)
            ...     trainer = prepare_pipeline_training(model, ["1"], example_args=(x,), loss_fn=torch.nn.functional.mse_loss)
            ...     optimizer = torch.optim.SGD(trainer.parameters(), lr=0.1)
            ...     assert len(optimizer.param_groups[0]["params"]) == 2  # this stage's weight and bias
            >>> hasten.debug_launcher(stage_parameters, num_processes=2)
        """
        return self.stage_module.parameters()

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """This stage's parameters under the full model's names (``"layers.3.weight"``).

        Example:
            >>> import hasten
            >>> def names():  # in each of 2 processes
            ...     hasten.PartialState(cpu=True)
            ...     model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)), torch.randn(4, 4)
            ...     trainer = prepare_pipeline_training(model, ["1"], example_args=(x,), loss_fn=torch.nn.functional.mse_loss)
            ...     grads = {name: p.grad for name, p in trainer.named_parameters()}
            ...     assert sorted(grads) == (["0.bias", "0.weight"] if trainer.is_first_stage else ["1.bias", "1.weight"])
            >>> hasten.debug_launcher(names, num_processes=2)
        """
        return self.stage_module.named_parameters()

    def step(self, *args: Any, target: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Forward and backward one batch; return its mean loss (the same value in every process).

        Call it in every process; `args`/`kwargs` are read by the first stage
        and `target` by the last, so others may pass them or not. The batch
        size must be the example's.

        Example:
            >>> import hasten
            >>> def one_step():  # in each of 2 processes
            ...     hasten.PartialState(cpu=True)
            ...     torch.manual_seed(0)
            ...     model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
            ...     inputs, labels = torch.randn(4, 4), torch.randn(4, 1)
            ...     expected = torch.nn.functional.mse_loss(model(inputs), labels)
            ...     trainer = prepare_pipeline_training(model, ["1"], example_args=(inputs,),
            ...                                         loss_fn=torch.nn.functional.mse_loss)
            ...     loss = trainer.step(inputs, target=labels)
            ...     assert torch.allclose(loss, expected)  # the mean loss of the unsplit model
            >>> hasten.debug_launcher(one_step, num_processes=2)
        """
        if self.stage.is_first:
            batch = _batch_size(args, kwargs)
            if batch != self.batch_size:
                raise ValueError(f"the pipeline was traced for batches of {self.batch_size}, got {batch}; use "
                                 "that batch size (drop_last=True) or prepare again with a matching example.")
        if self.stage.is_last and target is None:
            raise ValueError("the last pipeline stage needs the target to compute the loss; pass target=... in "
                             "every process.")
        losses: list[torch.Tensor] = []
        if self.stage.is_first:
            self.schedule.step(*args, target=target, losses=losses, **kwargs)
        else:
            self.schedule.step(target=target, losses=losses)
        self.last_losses = losses
        mean = (torch.stack([loss.detach() for loss in losses]).mean() if losses
                else torch.zeros((), device=self.stage.device))
        dist.broadcast(mean, src=dist.get_world_size() - 1)  # every process can log it
        return mean


def prepare_pipeline_training(model: torch.nn.Module, split_points: str | Sequence[str] = "auto",
                              example_args: tuple = (), example_kwargs: dict[str, Any] | None = None,
                              loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
                              num_chunks: int | None = None, schedule: str = "gpipe",
                              no_split_module_classes: Sequence[str] | None = None) -> PipelineTrainer:
    """Split `model` into one stage per process for training with a GPipe or 1F1B schedule.

    Args:
        model: the full model, built with the same weights in every process (put it in train mode first:
            the trace keeps the mode it was made in).
        split_points: module names each stage after the first starts with, or ``"auto"``.
        example_args: a batch shaped like the training batches (a multiple of `num_chunks`).
        example_kwargs: keyword inputs of that batch, if the model takes any.
        loss_fn: ``loss_fn(output, target) -> scalar`` for one micro-batch, mean-reduced.
        num_chunks: micro-batches per batch (default: the number of processes; 1F1B needs at least that many).
        schedule: ``"gpipe"`` (all forwards, then all backwards) or ``"1f1b"`` (interleaved: less activation
            memory).
        no_split_module_classes: class names ``"auto"`` must keep inside one stage.

    Example:
        >>> import hasten
        >>> def train():  # in each of 2 processes
        ...     hasten.PartialState(cpu=True)
        ...     torch.manual_seed(0)
        ...     model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        ...     x, y = torch.randn(8, 4), torch.randn(8, 1)
        ...     trainer = prepare_pipeline_training(model, ["2"], example_args=(x,),
        ...                                         loss_fn=torch.nn.functional.mse_loss, schedule="1f1b")
        ...     optimizer = torch.optim.SGD(trainer.parameters(), lr=0.1)
        ...     loss = trainer.step(x, target=y); optimizer.step(); optimizer.zero_grad()
        >>> hasten.debug_launcher(train, num_processes=2)
    """
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    if loss_fn is None:
        raise ValueError("pipelined training needs loss_fn(output, target); pass e.g. "
                         "loss_fn=torch.nn.functional.cross_entropy.")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; use one of {SCHEDULES}.")
    built = _build_stage(model, split_points, no_split_module_classes, tuple(example_args), example_kwargs,
                         num_chunks)
    stage, num_chunks = built.stage, built.num_chunks
    if schedule == "1f1b" and num_chunks < stage.num_stages:
        raise ValueError(f"the 1F1B schedule needs at least as many micro-batches as stages ({stage.num_stages}), "
                         f"got num_chunks={num_chunks}; raise num_chunks or use schedule='gpipe'.")
    schedule_class = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B

    def structured_loss(output: Any, target: Any) -> torch.Tensor:  # loss_fn sees forward's own output structure
        return loss_fn(built.restore_output(output), target)

    return PipelineTrainer(schedule_class(stage, num_chunks, loss_fn=structured_loss), stage, built.split_points,
                           num_chunks, built.batch_size)
