"""The Accelerator's checkpoint part: Accelerate's checkpoint methods, over `hasten.checkpointing`.

This part keeps what a checkpoint holds beyond the prepared objects (the
registered objects, the pre-hooks) and builds, at each call, the plain
`SaveSet` the checkpoint layer is handed; that layer never sees the
`Accelerator`.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..core.errors import CheckpointError

if TYPE_CHECKING:
    from .elastic import ElasticRun
    from ..checkpointing.preemption import BoundaryWatch
    from ..checkpointing.saveset import LoadHook, ProcessFacts, SaveHook, SaveSet
    from ..checkpointing.project import ProjectConfiguration
    from ..data.loader import PreparedDataLoader
    from ..options import DataLoaderConfiguration
    from ..runtime.gradient_state import GradientState
    from ..runtime.optimizer import AcceleratedOptimizer
    from ..runtime.scheduler import AcceleratedScheduler
    from ..runtime.accelerator_state import AcceleratorState
    from ..strategies.base import Strategy

__all__ = ["CheckpointPart"]


def _training_progress(accelerator: "weakref.ref[CheckpointPart]") -> Callable[[], list[int] | None]:
    """Batches each training loader handed out so far (never reset): a process past the main process's batch
    did not call save_state there (see `checkpointing.handshake`)."""

    def progress() -> list[int] | None:
        owner = accelerator()
        if owner is None:
            return None
        cursors = [getattr(loader, "cursor", None) for loader in owner._dataloaders]
        return [c.handed_out for c in cursors if c is not None and c.training]

    return progress


class _SaveState:
    """The preemption watch's save: the Accelerator's `save_state`, through a weak reference.

    No reference cycle, so a deleted Accelerator is freed at once (with its
    loaders), as Accelerate's is; it pickles with the Accelerator.
    """

    def __init__(self, owner: CheckpointPart, in_background: bool = False) -> None:
        self._owner = weakref.ref(owner)
        self.in_background = in_background  # a periodic save: asynchronous where the engine can

    def __call__(self) -> str:
        owner = self._owner()
        if owner is None:
            raise RuntimeError("the Accelerator this preemption watch saves is gone; nothing can be saved.")
        if self.in_background:
            try:
                return owner._save_everywhere(in_background=True)
            except CheckpointError as refused:
                if "async_save" not in str(refused):  # an engine that saves only in the foreground (DeepSpeed)
                    raise
                self.in_background = False
        return owner._save_everywhere(in_background=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._owner(), self.in_background)


class CheckpointPart:
    """`save_state` / `load_state`, registered objects, hooks, `save_model`, `get_state_dict`.

    Example:
        >>> import tempfile
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
        >>> accelerator.load_state(accelerator.save_state(tempfile.mkdtemp() + "/ckpt")) is not None
        True
    """

    # Shared values this part reads (set once by `Accelerator.__init__`).
    state: AcceleratorState
    strategy: Strategy
    gradient_state: GradientState
    scaler: torch.amp.GradScaler | None
    project_configuration: ProjectConfiguration
    dataloader_config: DataLoaderConfiguration  # `use_stateful_dataloader`: loaders resume their position
    _models: list[nn.Module]  # Accelerate's view (what the hooks receive)
    _wrappers: dict[int, nn.Module]  # id of a `_models` entry -> the prepared model behind it, where they differ
    _optimizers: list[AcceleratedOptimizer]
    _schedulers: list[AcceleratedScheduler]
    _dataloaders: list[PreparedDataLoader]
    _elastic: ElasticRun | None

    def _init_checkpoints(self) -> None:
        """Registered objects and hooks; the batch-boundary watch (preemption, progress); progress for the watchdog.

        Called last in `Accelerator.__init__`: with preemption on several
        processes the watch builds a gloo group (a collective).
        """
        self._custom_objects: list[Any] = []
        # OrderedDict: torch's RemovableHandle keeps a weak reference to it (a plain dict cannot have one)
        self._save_state_pre_hooks: OrderedDict[int, SaveHook] = OrderedDict()
        self._load_state_pre_hooks: OrderedDict[int, LoadHook] = OrderedDict()
        from ..checkpointing.preemption import PROGRESS_ENV, BoundaryWatch  # (loaded when an Accelerator is made)
        from ..process import watchdog

        watchdog.set_progress(_training_progress(weakref.ref(self)))
        # Batch boundaries of the training loader: preemption (with automatic naming) and restart progress.
        periodic = self.project_configuration.periodic_saves()
        from ..process.launch_spec import LaunchSpec

        live = LaunchSpec.current().live_settings() if self._elastic is not None else None
        self._boundary_watch = BoundaryWatch(_SaveState(self), self._process_facts(),
                                             preemption=self.project_configuration.automatic_checkpoint_naming,
                                             progress_file=os.environ.get(PROGRESS_ENV), periodic=periodic,
                                             save_periodic=_SaveState(self, in_background=True) if periodic else None,
                                             count_steps=self._elastic is not None,
                                             step_boundaries=self._elastic is not None)
        self._boundary_watch.install(self.gradient_state)
        if self._elastic is not None:  # (a collective: every process builds its Accelerator)
            from .elastic import join_elastic_run

            join_elastic_run(self._elastic, self._boundary_watch, self.project_configuration.project_dir)
            if live is not None:  # survivors keep training in memory (facade/live.py)
                from .live import start_live

                start_live(self, self._elastic, live)

    def _process_facts(self) -> ProcessFacts:
        from ..checkpointing.saveset import ProcessFacts  # the checkpoint layer's types: loaded at the first save
        state = self.state
        return ProcessFacts(rank=state.process_index, world=state.num_processes, is_main=state.is_main_process,
                            is_local_main=state.is_local_main_process)

    def _save_set(self) -> SaveSet:
        """Everything a checkpoint holds, as the plain value `hasten.checkpointing` is handed."""
        from ..checkpointing.saveset import SaveSet

        return SaveSet(
            engine=self.strategy, process=self._process_facts(), project=self.project_configuration,
            counter=self.gradient_state, models=[self._wrappers.get(id(m), m) for m in self._models],
            hook_models=list(self._models), optimizers=list(self._optimizers),
            schedulers=list(self._schedulers), dataloaders=list(self._dataloaders), custom=list(self._custom_objects),
            scaler=self.scaler, save_pre_hooks=list(self._save_state_pre_hooks.values()),
            load_pre_hooks=list(self._load_state_pre_hooks.values()),
            restore_position=self.dataloader_config.use_stateful_dataloader,
            notes=self._run_notes if self._boundary_watch.counting else None,
            at_step_start=self._elastic is not None,
        )

    def _run_notes(self) -> dict[str, Any]:
        """What a checkpoint's manifest keeps of the run: optimizer steps counted, and an elastic run's group."""
        steps = self._boundary_watch.optimizer_steps
        return self._elastic.notes(steps) if self._elastic is not None else {"optimizer_steps": steps}

    # -- where ------------------------------------------------------------------------------
    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatic checkpoint gets (``checkpoint_<save_iteration>``)."""
        return self.project_configuration.iteration

    @property
    def step(self) -> int:
        """Micro-steps counted by `accumulate` in the current accumulation cycle (saved with the state)."""
        return self.gradient_state.step

    @step.setter
    def step(self, value: int) -> None:
        self.gradient_state.step = value

    # -- what is saved ----------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects with `save_state` / `load_state` (anything with `state_dict` / `load_state_dict`).

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.register_for_checkpointing(torch.nn.Linear(2, 2))
        """
        invalid = [f"Item at index {i} ({type(obj).__name__})" for i, obj in enumerate(objects)
                   if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
        if invalid:  # "Item at index N": the words Accelerate's message uses, which its tests match
            raise ValueError(
                f"register_for_checkpointing needs objects with state_dict() and load_state_dict(); "
                f"{', '.join(invalid)} lack them. Give them both methods (or wrap them in an object that has them)."
            )
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[[list[nn.Module], list[dict[str, Any]], str], None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before saving; popping from `weights` skips those models.

        Example:
            >>> from hasten import Accelerator
            >>> handle = Accelerator(cpu=True).register_save_state_pre_hook(lambda models, weights, out: None)
            >>> handle.remove()
        """
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[[list[nn.Module], str], None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before loading; popping from `models` skips loading those models."""
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle

    # -- save / load ------------------------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True,
                   async_save: bool = False, **save_model_func_kwargs: Any) -> str:
        """Save everything prepared and registered, atomically; returns the checkpoint directory.

        Without `output_dir`, automatic checkpoint naming writes
        ``project_dir/checkpoints/checkpoint_<iteration>`` and, with
        `total_limit`, removes the oldest complete ones after the new one is
        complete. The files have Accelerate's names, plus hasten's manifest
        ``hasten_checkpoint.json`` (written last: the checkpoint is complete).

        Call it on every process — or, as Accelerate allows, on the main
        process only (``if accelerator.is_main_process:``): with one process
        or DDP the main process then saves everything it holds without
        waiting for the others (they keep their own RNG states when loading);
        under FSDP or DeepSpeed, whose state is sharded, that call fails
        within seconds saying so.

        ``async_save=True`` returns as soon as the state is snapshotted; the
        files (the state as of the call, the same files a synchronous save
        writes) are written, checked and published in the background. The
        parameters and optimizer state are copied by the writer thread and
        every optimizer step waits for that copy, so change them only
        through ``optimizer.step()`` until then (or call ``wait()``): another
        in-place change fails the save. The returned path then also has
        ``wait()`` (blocks until published, raises the save's error) and
        ``done()``. The next `save_state`, `load_state`, a preemption save and
        the end of the run wait for it. FSDP2 uses DCP's async save;
        DeepSpeed refuses it, saying why.

        Example:
            >>> import tempfile
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> path = accelerator.save_state(tempfile.mkdtemp() + "/ckpt")
            >>> pending = accelerator.save_state(tempfile.mkdtemp() + "/ckpt", async_save=True)
            >>> pending.wait() == pending
            True
        """
        if save_model_func_kwargs:
            raise TypeError(f"save_state got unexpected keyword arguments {sorted(save_model_func_kwargs)}; "
                            "hasten's save_state takes output_dir, safe_serialization and async_save.")
        from ..checkpointing.save import save_checkpoint

        folder = None if output_dir is None else os.fspath(output_dir)

        def save() -> str:
            path = save_checkpoint(self._save_set(), folder, safe_serialization, async_save=async_save)
            return path if isinstance(path, str) else str(path)  # an asynchronous save's handle is a str already

        live = self._elastic.live if self._elastic is not None else None
        if live is not None:  # one machine writes what every machine holds (facade/live.py)
            return live.save_state_once(save, folder)
        return save()

    def _save_everywhere(self, in_background: bool) -> str:
        """hasten's own automatic save (periodic, preemption): every process calls it at the same batch boundary."""
        from ..checkpointing.save import save_checkpoint

        path = save_checkpoint(self._save_set(), None, True, async_save=in_background, everyone=True)
        return path if isinstance(path, str) else str(path)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, load_kwargs: dict[str, Any] | None = None,
                   **load_model_func_kwargs: Any) -> str | None:
        """Restore everything `save_state` saved; checks the whole checkpoint before changing anything.

        Without `input_dir`, automatic checkpoint naming loads the newest
        complete checkpoint, and does nothing (returns None) when the
        project has none yet — so one ``accelerator.load_state()`` line makes
        a script resume after a crash, a restart or a preemption. With
        ``DataLoaderConfiguration(use_stateful_dataloader=True)`` the loaders
        also resume their position: the next pass yields the rest of the
        interrupted epoch. Returns the directory loaded.

        A folder written by Accelerate's own `save_state` loads too (weights,
        optimizer, scheduler, scaler, registered objects, RNG states), so a run
        can switch libraries between two saves. Pickled files are read with
        ``weights_only=True``; for a checkpoint you trust that holds other
        Python objects, pass ``load_kwargs={"weights_only": False}`` (as
        under Accelerate). ``map_location`` is accepted and not needed.

        Example:
            >>> import tempfile
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> path = accelerator.save_state(tempfile.mkdtemp() + "/ckpt")
            >>> accelerator.load_state(path) == path
            True
        """
        load_model_func_kwargs.pop("map_location", None)  # hasten reads to the CPU and copies into place
        if load_model_func_kwargs:
            raise TypeError(f"load_state got unexpected keyword arguments {sorted(load_model_func_kwargs)}; "
                            "hasten's load_state takes input_dir, load_kwargs and map_location.")
        from ..checkpointing.load import load_checkpoint

        path = load_checkpoint(self._save_set(), None if input_dir is None else os.fspath(input_dir),
                               on_missing_rng=lambda message: print(f"hasten: {message}", flush=True),
                               load_kwargs=load_kwargs)
        if input_dir is None:  # automatic resume: say what happened
            if path is None:
                self.state.print(f"hasten: no checkpoint yet under {self.project_configuration.project_dir}; "
                                 "starting from the beginning.")
            else:
                self.state.print(f"hasten: resumed from {path}.")
        if path is not None and self._boundary_watch.counting:
            from ..checkpointing.commit import read_manifest
            from ..checkpointing.constants import MANIFEST_NAME

            notes = read_manifest(Path(path)).get("run") if (Path(path) / MANIFEST_NAME).exists() else None
            steps = int((notes or {}).get("optimizer_steps", 0))
            self._boundary_watch.restore_steps(steps)
            self.gradient_state.optimizer_steps = steps  # (a live run's machines number their steps from it)
            if self._elastic is not None and self._elastic.live is None:  # (live: no group re-forms, a joiner heals)
                from .elastic import report_reformation

                report_reformation(self, self._elastic, notes, str(path))
        if self._elastic is not None and self._elastic.live is not None:  # a joiner heals here, before the script
            self._elastic.live.join_now()                                 # reads where the run is
        return None if path is None else str(path)

    # -- model weights ------------------------------------------------------------------------
    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict (gathered from every process when the strategy shards it).

        Example:
            >>> from hasten import Accelerator
            >>> sorted(Accelerator(cpu=True).get_state_dict(torch.nn.Linear(2, 2)))
            ['bias', 'weight']
        """
        return self.strategy.model_state_dict(model)

    def save_model(self, model: nn.Module, save_directory: str | os.PathLike[str], max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write the model's weights as safetensors shards of at most `max_shard_size` plus an index (main process).

        Example:
            >>> import tempfile
            >>> from hasten import Accelerator
            >>> folder = tempfile.mkdtemp()
            >>> Accelerator(cpu=True).save_model(torch.nn.Linear(2, 2), folder)
            >>> import os; os.listdir(folder)
            ['model.safetensors']
        """
        from ..big_modeling.model_helpers import get_state_dict_offloaded_model, has_offloaded_params
        from ..checkpointing.model_files import write_model_files

        if any(has_offloaded_params(module) for module in model.modules()):
            # weights kept on cpu/disk by hooks: brought in one module at a time, so the files hold the real values
            state = get_state_dict_offloaded_model(model)
        else:
            if any(param.is_meta for param in model.parameters()):
                raise RuntimeError("You can't save the model since some parameters are on the meta device; load "
                                   "them first (load_checkpoint_in_model) or save the model they were loaded into.")
            state = self.get_state_dict(model)
        if self.state.is_main_process:
            if os.path.isfile(save_directory):
                raise ValueError(f"save_model needs a directory, but {save_directory} is a file.")
            write_model_files(state, Path(save_directory), max_shard_size, safe_serialization)
        self.state.wait_for_everyone()
