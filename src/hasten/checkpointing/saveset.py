"""What a checkpoint is made of, as one plain value: `SaveSet` (the checkpoint layer's whole input).

`save_checkpoint(saveset, ...)` and `load_checkpoint(saveset, ...)` are
handed everything they touch — the prepared objects, the process facts,
the project's naming, the strategy's seam for sharded state — so the
checkpoint layer never reaches into the `Accelerator` (which builds a
`SaveSet` at each call, `Accelerator._save_set()`).

Example:
    >>> import torch
    >>> from hasten.checkpointing.saveset import ProcessFacts, SaveSet
    >>> from hasten.checkpointing.project import ProjectConfiguration
    >>> from hasten.runtime.gradient_state import GradientState
    >>> from hasten.strategies import Strategy
    >>> saveset = SaveSet(engine=Strategy(torch.device("cpu")), process=ProcessFacts.alone(),
    ...                   project=ProjectConfiguration(), counter=GradientState(), models=[torch.nn.Linear(2, 2)])
    >>> len(saveset.models), saveset.process.world
    (1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch
from torch import nn

from .project import ProjectConfiguration
from .rng import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from ..data.loader import PreparedDataLoader

__all__ = ["SaveSet", "ProcessFacts", "CheckpointEngine", "Stateful", "StepCounter", "SaveHook", "LoadHook",
           "run_save_hooks", "run_load_hooks"]

#: ``hook(models, weights, output_dir)``, called before saving; popping from `weights` skips those models.
SaveHook = Callable[[list[nn.Module], list[dict[str, Any]], str], None]
#: ``hook(models, input_dir)``, called before loading; popping from `models` skips loading those models.
LoadHook = Callable[[list[nn.Module], str], None]


class Stateful(Protocol):
    """Anything saved as its `state_dict()` and restored with `load_state_dict` (schedulers, the scaler, registered objects)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


class StepCounter(Protocol):
    """Where the accumulation step lives (the gradient state): saved with the checkpoint, restored by loading."""

    step: int


class CheckpointEngine(Protocol):
    """The strategy's side of a checkpoint: full state dicts, or (sharded engines) its own files.

    Every `hasten.strategies.Strategy` is one; the checkpoint layer knows
    no engine by name.
    """

    @property
    def name(self) -> str: ...

    @property
    def writes_own_checkpoint_files(self) -> bool: ...

    @property
    def state_needs_every_process(self) -> bool: ...

    @property
    def reads_sharded_from(self) -> frozenset[str]: ...

    @property
    def peer_engine_saves_models(self) -> bool: ...

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]: ...

    def model_state_dict_shapes(self, model: nn.Module) -> dict[str, Any]: ...

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None: ...

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]: ...

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None: ...

    def model_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]: ...

    def load_model_gradients(self, model: nn.Module, gradients: dict[str, torch.Tensor]) -> None: ...

    def save_checkpoint_files(self, directory: Path, models: Sequence[nn.Module], optimizers: Sequence[Any]) -> dict[str, int]: ...

    def begin_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                               optimizers: Sequence[Any]) -> Callable[[], dict[str, int]]: ...

    def read_checkpoint_files(self, directory: Path, models: Sequence[nn.Module], optimizers: Sequence[Any]) -> Any: ...

    def apply_checkpoint_files(self, contents: Any) -> None: ...


@dataclass(frozen=True)
class ProcessFacts:
    """Who this process is among those that save: its rank, how many there are, whether it is (local) main."""

    rank: int
    world: int
    is_main: bool
    is_local_main: bool

    @classmethod
    def alone(cls) -> "ProcessFacts":
        """One process, main everywhere (a single-process run, or a test)."""
        return cls(rank=0, world=1, is_main=True, is_local_main=True)


@dataclass
class SaveSet:
    """Everything `save_checkpoint` writes and `load_checkpoint` restores, in prepare order.

    The lists are the live objects (loading changes them in place);
    `project` and `counter` are updated by saving (the next iteration) and
    loading (the saved step and iteration).
    """

    engine: CheckpointEngine  # the strategy: state dicts through it, sharded files by it
    process: ProcessFacts
    project: ProjectConfiguration  # naming, rotation, iteration, save_on_each_node
    counter: StepCounter  # the gradient state's accumulation step
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)  # the prepared (wrapping) optimizers
    schedulers: list[Stateful] = field(default_factory=list)
    dataloaders: list[PreparedDataLoader] = field(default_factory=list)
    custom: list[Stateful] = field(default_factory=list)  # register_for_checkpointing's objects
    scaler: Stateful | None = None  # the fp16 GradScaler
    save_pre_hooks: list[SaveHook] = field(default_factory=list)
    load_pre_hooks: list[LoadHook] = field(default_factory=list)
    # What the hooks receive for `models`, index for index: Accelerate's `accelerator._models` (the user's modules
    # under DDP, the engine's wrappers under FSDP and DeepSpeed); None: `models` themselves.
    hook_models: list[nn.Module] | None = None
    restore_position: bool = False  # loaders resume mid-pass (use_stateful_dataloader)
    # The RNG policy: every generator of the process, captured at save and restored at load.
    capture_rng: Callable[[], dict[str, Any]] = capture_rng_state
    restore_rng: Callable[[dict[str, Any]], None] = restore_rng_state
    # Facts of the run kept in the manifest's "run" entry (optimizer steps, the group that saved): read, never applied
    notes: Callable[[], dict[str, Any]] | None = None
    # An elastic run: a checkpoint holds the state at the start of the optimizer step under way (no partial gradients,
    # the accumulation count at 0; its loaders say where that step began), so any group size resumes it exactly.
    at_step_start: bool = False

    @property
    def accumulation_count(self) -> int:
        """The accumulation count a checkpoint keeps (Accelerate's "step")."""
        return 0 if self.at_step_start else int(self.counter.step)


def run_save_hooks(saveset: SaveSet, weights: list[dict[str, Any]], output_dir: str) -> None:
    """Call the save pre-hooks as Accelerate does; a hook may pop from `weights` the models it saves itself.

    Where Accelerate's engine saves the models itself (FSDP, DeepSpeed) the
    hooks get an empty list of weights, and hasten saves every model.
    """
    seen = [] if saveset.engine.peer_engine_saves_models else weights
    models = list(saveset.models if saveset.hook_models is None else saveset.hook_models)
    for hook in saveset.save_pre_hooks:
        hook(models, seen, output_dir)


def run_load_hooks(saveset: SaveSet, input_dir: str) -> list[nn.Module]:
    """Call the load pre-hooks as Accelerate does; return the models left for hasten to load.

    A hook may pop the models it loads itself (e.g. with `from_pretrained`);
    it sees Accelerate's entries, and each left in the list keeps its wrapper
    here. Where Accelerate's engine loads the models itself (FSDP, DeepSpeed)
    the hooks get an empty list and hasten loads every model.
    """
    views = list(saveset.models if saveset.hook_models is None else saveset.hook_models)
    if saveset.engine.peer_engine_saves_models:
        for hook in saveset.load_pre_hooks:
            hook([], input_dir)
        return list(saveset.models)
    left = list(views)
    for hook in saveset.load_pre_hooks:
        hook(left, input_dir)
    return [model for model, view in zip(saveset.models, views) if any(view is kept for kept in left)]

