"""The worker's side of an elastic run: the recipe of MAX machines at any size, and the line a re-formation prints.

`hasten launch --num_machines MIN:MAX` starts the script again on every
process each time torch's agents re-form the group. Nothing in the script
changes; `Accelerator()` reads the range from the launch spec and:

- accumulates ``accumulation x max processes / processes`` batches per
  optimizer step (the global batch of MAX; `hasten.process.elastic`), and
  refuses, before the first step, a range some size of which cannot keep it;
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
from typing import Any

from ..options import GradientAccumulationPlugin
from ..process.elastic import ElasticSizes
from ..process.exit import on_failure
from ..process.launch_spec import MACHINE_ENV, LaunchSpec

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
    """An elastic run as this group sees it: the range, the script's accumulation (at MAX), the group now.

    Example:
        >>> ElasticRun(ElasticSizes(2, 4, 2), accumulation=3, world=2).accumulation_now
        6
    """

    sizes: ElasticSizes
    accumulation: int  # what the script asked for: the accumulation at MAX processes
    world: int
    machines: list[str] = field(default_factory=list)  # this group's machines, in the order of their first rank

    @property
    def accumulation_now(self) -> int:
        return self.sizes.accumulation_at(self.world, self.accumulation)

    @property
    def scheduler_steps(self) -> int:
        """Times a prepared scheduler advances per optimizer step: Accelerate's rule at MAX processes."""
        return self.sizes.max_processes

    def notes(self, optimizer_steps: int) -> dict[str, Any]:
        """What a checkpoint's manifest keeps of the group that saved it."""
        return {"optimizer_steps": optimizer_steps, "processes": self.world, "machines": list(self.machines),
                "gradient_accumulation_steps": self.accumulation_now}


def elastic_run(spec: LaunchSpec, world: int, plugin: GradientAccumulationPlugin
                ) -> tuple[GradientAccumulationPlugin, ElasticRun | None]:
    """The accumulation plugin this process trains with, and the elastic run (None when the launch is not elastic).

    Every size of the range is checked here, at the start, so a range that
    cannot keep the global batch is refused before the first step rather than
    at the first shrink.

    Example:
        >>> spec = LaunchSpec(elastic={"min_processes": 1, "max_processes": 2, "processes_per_machine": 1})
        >>> plugin, run = elastic_run(spec, 1, GradientAccumulationPlugin(num_steps=3))
        >>> plugin.num_steps, run.accumulation
        (6, 3)
    """
    sizes = spec.elastic_sizes()
    if sizes is None:
        return plugin, None
    accumulation = int(plugin.num_steps or 1)
    sizes.check(accumulation)
    if not sizes.min_processes <= world <= sizes.max_processes:
        raise ValueError(f"this elastic run has {world} processes, outside its range of {sizes.min_processes} to "
                         f"{sizes.max_processes}; start every machine with the same hasten launch command.")
    run = ElasticRun(sizes, accumulation, world)
    return replace(plugin, num_steps=run.accumulation_now), run


def record_reached(project_dir: str | None, optimizer_steps: int) -> None:
    """Note, in the project directory, the optimizer steps this group reached (a failing process's last word).

    Every failing process may write it; they write the same number, each
    through its own temporary file and an atomic rename.
    """
    if not project_dir:
        return
    path = Path(project_dir) / REACHED_FILE
    temporary = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"optimizer_steps": int(optimizer_steps)}))
    os.replace(temporary, path)


def read_reached(project_dir: str | None) -> int | None:
    """The optimizer steps the last group reached before it broke up (None: no record)."""
    if not project_dir:
        return None
    try:
        return int(json.loads((Path(project_dir) / REACHED_FILE).read_text())["optimizer_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def reformation(run: ElasticRun, saved: dict[str, Any] | None, checkpoint: str, reached: int | None
                ) -> tuple[str, dict[str, Any]] | None:
    """The line and tracker record of a re-formation (None when the checkpoint's group is this one).

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
    steps = int(saved.get("optimizer_steps", 0) or 0)
    before_world, before = saved.get("processes"), list(saved.get("machines") or [])
    redone = max(0, reached - steps) if reached is not None else 0
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
            record_reached(project_dir, live.optimizer_steps)

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
