"""The worker's side of an elastic run: the recipe of MAX processes at any size, and the line a re-formation prints.

`hasten launch --num_machines MIN:MAX` starts the script again on every
process each time torch's agents re-form the group. Nothing in the script
changes; `Accelerator()` reads the range from the launch spec and:

- deals each optimizer step's M = MAX processes x accumulation micro-batches
  over the processes it has (`hasten.process.elastic`, `hasten.data.elastic`):
  a process synchronises at its last micro-batch of the step, each
  micro-batch's loss counts P / M, and where the engine needs every process to
  run as many forward and backward passes (FSDP2, DeepSpeed), a process with
  one micro-batch fewer replays its last one with a weight of zero (a *filler*
  pass the script never sees), so the collectives match;
- steps the prepared schedulers ``max processes`` times per optimizer step
  (Accelerate's rule at MAX), so the learning rate follows optimizer steps;
- counts optimizer steps (saved in each checkpoint's manifest) and, when a
  process fails, records how far the group got (`record_reached`);
- after the script's `load_state()`, says in one line on the main process
  who left or joined, the new size and accumulation, the checkpoint resumed
  from and the steps redone, and logs the same facts to the trackers.

Example:
    >>> from hasten.process.elastic import ElasticSizes
    >>> run = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=1, machines=["a/0"])
    >>> run.accumulation_now, run.scheduler_steps
    (2, 2)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..options import GradientAccumulationPlugin
from ..process.elastic import ElasticLayout, ElasticSizes
from ..process.exit import on_failure
from ..process.launch_spec import MACHINE_ENV, LaunchSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..runtime.gradient_state import GradientState
    from ..strategies.base import Strategy

__all__ = ["ElasticRun", "elastic_run", "machine_label", "REACHED_FILE", "record_reached", "read_reached",
           "reformation", "join_elastic_run", "report_reformation"]

REACHED_FILE = ".hasten-elastic-reached.json"  # in the project directory: how far the last group got


def machine_label() -> str:
    """This machine's name in re-formation lines: what the launcher exported, else the host name.

    Example:
        >>> isinstance(machine_label(), str)
        True
    """
    return os.environ.get(MACHINE_ENV) or socket.gethostname()


@dataclass
class ElasticRun:
    """An elastic run as this process sees it: the range, the script's accumulation (at MAX), the group now.

    Example:
        >>> run = ElasticRun(ElasticSizes(1, 3, 1), accumulation=1, world=2, rank=1)
        >>> run.accumulation_now, run.layout.divisor   # 3 micro-batches a step: process 1 takes one of them
        (1, 1.5)
    """

    sizes: ElasticSizes
    accumulation: int  # what the script asked for: the accumulation at MAX processes
    world: int
    rank: int = 0
    machines: list[str] = field(default_factory=list)  # this group's machines, in the order of their first rank
    # the engine needs as many forward/backward passes on every process (a filler where a process has one fewer)
    fillers: bool = False
    short_by: int = 0  # fillers owed at the end of the step under way (set at its last micro-batch)
    # the last training forward of each model that gets fillers: model id -> (model, args, kwargs)
    _forwards: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict, repr=False)
    _models: list[Any] = field(default_factory=list, repr=False)  # weak references to the trained models
    live: Any = None  # a live run's `LiveStep` (facade/live.py): the group and rank come from each step's quorum

    @property
    def layout(self) -> ElasticLayout:
        """How this group deals out the micro-batches of a step (`hasten.process.elastic.ElasticLayout`)."""
        return ElasticLayout(self.sizes.max_processes, self.world, self.rank, self.accumulation)

    @property
    def accumulation_now(self) -> int:
        """This process's micro-batches in a full step (`gradient_accumulation_steps` at this size)."""
        return self.layout.own()

    @property
    def scheduler_steps(self) -> int:
        """Times a prepared scheduler advances per optimizer step: Accelerate's rule at MAX processes."""
        return self.sizes.max_processes

    def notes(self, optimizer_steps: int) -> dict[str, Any]:
        """What a checkpoint's manifest keeps of the group that saved it."""
        return {"optimizer_steps": optimizer_steps, "processes": self.world, "machines": list(self.machines),
                "gradient_accumulation_steps": self.accumulation_now}

    # -- the hot path ------------------------------------------------------------------------------
    def training_pass(self) -> bool:
        """A loader pass that starts now trains: the trained models are in training mode (or none is known yet)."""
        models = [model for model in (ref() for ref in self._models) if model is not None]
        return not models or any(model.training for model in models)

    def advance(self, state: GradientState) -> None:
        """`accumulate()`'s count: synchronise at this process's last micro-batch of the step (from the loader), else
        every `accumulation_now` batches as Accelerate counts."""
        position = state.position
        micro = position.micro_batch if position is not None else None
        if micro is not None:
            state.sync_gradients = micro.ends_step
            state.step = 0 if micro.ends_step else state.step + 1
            self.short_by = micro.short_by if micro.ends_step and self.fillers else 0
            return
        self.short_by = 0
        if state.sync_with_dataloader and state.end_of_dataloader:
            state.step, state.sync_gradients = 0, True
        else:
            state.step += 1
            state.sync_gradients = state.step % state.num_steps == 0

    def backward(self, strategy: Strategy, state: GradientState, loss: torch.Tensor, **kwargs: Any) -> None:
        """The micro-batch's backward at its weight (P / M), then the fillers this process owes the step."""
        divisor = self.layout.divisor
        if not (self.short_by and state.sync_gradients):
            strategy.backward(loss, divisor, **kwargs)
            if self.live is not None and state.sync_gradients:  # the step's one all-reduce across machines
                self.live.reduce()
            return
        state.sync_gradients = False  # the filler's backward synchronises, not this one (an engine reads the flag)
        try:
            strategy.backward(loss, divisor, **kwargs)
        finally:
            state.sync_gradients = True
        for _ in range(self.short_by):
            for model, args, model_kwargs in list(self._forwards.values()):
                strategy.filler_step(model, lambda: _zero_loss(strategy, model, args, model_kwargs))
        self.short_by = 0
        if self.live is not None:  # (a live pass owes no fillers: a machine's processes take as many micro-batches)
            self.live.reduce()

    def set_accumulation(self, steps: int, strategy: Strategy) -> None:
        """`accelerator.gradient_accumulation_steps = steps` in an elastic run: the recipe's accumulation at MAX."""
        batch = getattr(strategy, "elastic_batch", None)
        if batch is not None and getattr(strategy, "engine", None) is not None:
            raise ValueError(f"gradient_accumulation_steps changed to {steps} after the DeepSpeed engine was built with "
                             f"{batch.recipe_accumulation}; set it before accelerator.prepare.")
        self.accumulation = steps
        if batch is not None:
            strategy.elastic_batch = type(batch)(self.layout.most, steps, batch.max_processes)  # type: ignore[attr-defined]
            strategy.accumulation_steps = self.layout.most  # type: ignore[attr-defined]

    def trains(self, model: nn.Module, fillers: bool) -> None:
        """`model` was prepared for training; with `fillers`, its training forwards are remembered for them."""
        self._models.append(weakref.ref(model))
        if fillers:
            self.fillers = True
            model.register_forward_pre_hook(self._remember, with_kwargs=True)

    def _remember(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        if model.training and torch.is_grad_enabled():
            self._forwards[id(model)] = (model, args, kwargs)


def _zero_loss(strategy: Strategy, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """The filler's loss: the model's last training forward again, times zero (the random streams and the buffers,
    e.g. batch norm's running statistics, are put back as they were: the filler changes nothing but the count)."""
    import torch

    buffers = [(buffer, buffer.detach().clone()) for buffer in strategy.unwrap_model(model).buffers()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        output = model(*args, **kwargs)
    with torch.no_grad():
        for buffer, saved in buffers:
            buffer.copy_(saved)
    terms = [t.float().sum() for t in _tensors(output) if t.requires_grad and t.is_floating_point()]
    if not terms:
        raise RuntimeError("an elastic run's filler pass found no output of the model that needs a gradient, so it "
                           "cannot take part in this step's synchronisation; return the loss or logits from forward.")
    return torch.stack(terms).sum() * 0.0


def _tensors(output: Any) -> list[Any]:
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for value in output.values() for t in _tensors(value)]
    if isinstance(output, (list, tuple)):
        return [t for value in output for t in _tensors(value)]
    return []


def elastic_run(spec: LaunchSpec, world: int, rank: int, plugin: GradientAccumulationPlugin,
                accumulation_given: bool = True, deepspeed_plugin: Any = None
                ) -> tuple[GradientAccumulationPlugin, ElasticRun | None, Any]:
    """This process's accumulation plugin, the elastic run (None when the launch is not elastic) and, under
    DeepSpeed, the engine's `ElasticBatch`: the global batch decided once, before any engine exists.

    The accumulation at MAX processes is the one given to the Accelerator (or the launch), else the DeepSpeed
    config's (its ``gradient_accumulation_steps``, or ``train_batch_size`` over the micro-batch and MAX processes).

    Example:
        >>> spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 3, "processes_per_machine": 1})
        >>> plugin, run, _ = elastic_run(spec, 2, 0, GradientAccumulationPlugin(num_steps=1))
        >>> plugin.num_steps, run.accumulation, run.layout.micro_batches
        (2, 1, 3)
    """
    sizes = spec.elastic_sizes()
    if sizes is None:
        return plugin, None, None
    if not plugin.sync_with_dataloader:
        raise ValueError("an elastic run starts each pass with a new optimizer step, as Accelerate's default does; "
                         "drop sync_with_dataloader=False from the GradientAccumulationPlugin.")
    sizes.check_world(world)
    accumulation = int(plugin.num_steps or 1)
    batch = None
    if deepspeed_plugin is not None:
        from ..strategies.deepspeed.engine_config import ElasticBatch, recipe_accumulation

        named = list(deepspeed_plugin.values()) if isinstance(deepspeed_plugin, dict) else [deepspeed_plugin]
        active = next((one for one in named if getattr(one, "selected", False)), named[0])
        accumulation = recipe_accumulation(active, accumulation, accumulation_given, sizes.max_processes)
    run = ElasticRun(sizes, accumulation, world, rank)
    if deepspeed_plugin is not None:
        batch = ElasticBatch(run.layout.most, accumulation, sizes.max_processes)
    return replace(plugin, num_steps=run.accumulation_now), run, batch


def record_reached(project_dir: str | None, optimizer_steps: int, processes: int | None = None,
                   machines: list[str] | None = None) -> None:
    """Note, in the project directory, the optimizer steps this group reached and the group (a failing process's
    last word): the next group says who left it, even when the newest checkpoint was written by an earlier one.

    Every failing process may write it; they write the same values, each
    through its own temporary file and an atomic rename.
    """
    if not project_dir:
        return
    path = Path(project_dir) / REACHED_FILE
    temporary = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    record: dict[str, Any] = {"optimizer_steps": int(optimizer_steps)}
    if processes is not None:
        record.update(processes=int(processes), machines=list(machines or []))
    temporary.write_text(json.dumps(record))
    os.replace(temporary, path)


def read_reached(project_dir: str | None) -> dict[str, Any] | None:
    """How far the last group got before it broke up, and the group (None: no record)."""
    if not project_dir:
        return None
    try:
        record = json.loads((Path(project_dir) / REACHED_FILE).read_text())
        return {**record, "optimizer_steps": int(record["optimizer_steps"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def reformation(run: ElasticRun, saved: dict[str, Any] | None, checkpoint: str,
                reached: dict[str, Any] | int | None) -> tuple[str, dict[str, Any]] | None:
    """The line and tracker record of a re-formation (None when the group that broke up is this one and nothing is
    redone). The group before is the one that broke up (`reached`, when a failing process recorded it), else the
    checkpoint's.

    Example:
        >>> run = ElasticRun(ElasticSizes(1, 2, 1), accumulation=1, world=1, machines=["a/0"])
        >>> saved = {"optimizer_steps": 12, "processes": 2, "machines": ["a/0", "b/1"]}
        >>> line, record = reformation(run, saved, "runs/checkpoints/checkpoint_3", reached=15)
        >>> line
        'elastic run re-formed: 2 -> 1 processes on 1 machine(s) (left: b/1); gradient accumulation 2, global batch kept (2 processes x 1); resumed from runs/checkpoints/checkpoint_3 at optimizer step 12; 3 step(s) redone'
        >>> record["elastic/steps_redone"]
        3
    """
    saved = saved or {}
    if isinstance(reached, int):
        reached = {"optimizer_steps": reached}
    steps = int(saved.get("optimizer_steps", 0) or 0)
    group = reached if reached is not None and "processes" in reached else saved
    before_world, before = group.get("processes"), list(group.get("machines") or [])
    redone = max(0, int(reached["optimizer_steps"]) - steps) if reached is not None else 0
    if before_world == run.world and before == run.machines and not redone:
        return None
    left = [m for m in before if m not in run.machines]
    joined = [m for m in run.machines if m not in before]
    who = "; ".join(part for part in (f"left: {', '.join(left)}" if left else "",
                                      f"joined: {', '.join(joined)}" if joined else "") if part)
    line = (f"elastic run re-formed: {before_world if before_world is not None else '?'} -> {run.world} processes on "
            f"{len(run.machines)} machine(s){f' ({who})' if who else ''}; gradient accumulation {run.accumulation_now}, "
            f"global batch kept ({run.sizes.max_processes} processes x {run.accumulation}); resumed from {checkpoint} "
            f"at optimizer step {steps}; {redone} step(s) redone")
    record = {"elastic/processes": run.world, "elastic/machines": len(run.machines),
              "elastic/gradient_accumulation_steps": run.accumulation_now, "elastic/resumed_step": steps,
              "elastic/steps_redone": redone}
    return line, record


def join_elastic_run(run: ElasticRun, watch: Any, project_dir: str | None) -> None:
    """At `Accelerator()`: learn the group's machines (a collective) and leave word of the steps reached on failure."""
    import torch.distributed as dist

    labels = [machine_label()]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, labels[0])
        labels = [str(label) for label in everyone]
    run.machines = list(dict.fromkeys(labels))  # each machine once, in the order of its first rank
    reference = weakref.ref(watch)

    def reached() -> None:
        live = reference()
        if live is not None:
            record_reached(project_dir, live.optimizer_steps, run.world, run.machines)

    on_failure(reached)


def report_reformation(owner: Any, run: ElasticRun, saved: dict[str, Any] | None, checkpoint: str) -> None:
    """After `load_state` in an elastic run: the re-formation's line (main process) and its tracker record."""
    project_dir = owner.project_configuration.project_dir
    found = reformation(run, saved, checkpoint, read_reached(project_dir))
    if found is None:
        return
    line, record = found
    if owner.state.is_main_process:  # one line for the run (Accelerate's print is one per machine)
        print(f"hasten: {line}.", flush=True)
        if project_dir:
            with contextlib.suppress(OSError):
                (Path(project_dir) / REACHED_FILE).unlink()
    # on the trackers' step axis at the furthest step the run has reached, so the axis never goes backwards
    owner._log_elastic_record(record, step=int(record["elastic/resumed_step"]) + int(record["elastic/steps_redone"]))
