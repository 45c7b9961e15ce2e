"""The `Accelerator` facade: decides once in `__init__`/`prepare`, then gets out of the way.

It holds no distributed logic of its own: the process layout comes from
`PartialState`, model wrapping from a strategy, casting from a precision
policy, sharding from `hasten.data`, collectives from `hasten.runtime.collectives`,
checkpoints from `hasten.checkpointing` (handed a plain `SaveSet`).

The public methods live in the facade's parts (`hasten.facade`), one
concern each: processes and collectives, prepare, checkpoints, trackers,
runtime helpers. `__init__` below sets the values they share, once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Union

import torch
from torch import nn
from torch.utils.data import DataLoader

from .checkpointing.project import ProjectConfiguration
from .facade.accumulation import decide_accumulation
from .facade.checkpoints import CheckpointPart
from .facade.preparing import PreparePart, make_dynamo_plugin
from .facade.processes import ProcessPart
from .facade.runtime import RuntimePart
from .facade.trackers import TrackerPart
from .fp8.setup import Fp8Setup, recipe_handlers
from .runtime.gradient_state import GradientState
from .process.launch_spec import LaunchSpec
from .options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    FP8BackendType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    TorchDynamoPlugin,
    split_kwargs_handlers,
)
from .process.group import shutdown_process_group
from .runtime.optimizer import AcceleratedOptimizer
from .runtime.scheduler import SchedulerKwargs
from .runtime.accelerator_state import AcceleratorState, activate_deepspeed_plugins, shared_deepspeed_plugins
from .strategies.select import select_strategy

if TYPE_CHECKING:
    from .strategies.deepspeed.plugin import DeepSpeedPlugin
    from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin
    from .strategies.parallel.mesh import ParallelismConfig
    from .strategies.parallel.tp_size import TorchTensorParallelPlugin

__all__ = ["Accelerator"]

_DeepSpeedPlugins = Union["DeepSpeedPlugin", "dict[str, DeepSpeedPlugin]"]  # one, or Accelerate's named ones

# Names Accelerate's accelerator module has, which its tests patch there (the check itself is big_modeling/quantized.py):
# looked up on first use, so `from hasten import Accelerator` does not load the availability probes.
_PATCHABLE = ("is_bitsandbytes_multi_backend_available", "is_xpu_available")


def __getattr__(name: str) -> Any:
    if name in _PATCHABLE:
        from .core import availability

        value = globals()[name] = getattr(availability, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_UNSUPPORTED = {
    "megatron_lm_plugin": "Megatron-LM, which needs NVIDIA GPUs and the megatron-core package",
}


def _given_deepspeed_plugins(deepspeed_plugin: Any, deepspeed_plugins: Any) -> tuple[Any, bool]:
    """(one plugin or Accelerate's dict of named ones, or None; whether they are this Accelerator's own).

    `deepspeed_plugin` and `deepspeed_plugins` are aliases. As in Accelerate,
    an Accelerator given none shares the plugins of the process's DeepSpeed
    Accelerator (a second Accelerator trains a second model under them), and
    may not be given new ones.
    """
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError("pass deepspeed_plugin or deepspeed_plugins, not both.")
    given = deepspeed_plugin if deepspeed_plugin is not None else deepspeed_plugins
    shared = shared_deepspeed_plugins()
    if given is None:
        return shared, shared is None
    if shared is not None:
        raise NotImplementedError("an Accelerator of this process already runs DeepSpeed, whose plugins every later "
                                  "Accelerator shares; create this one without deepspeed_plugin(s) (select among named "
                                  "ones with accelerator.state.select_deepspeed_plugin(name)), or call "
                                  "AcceleratorState._reset_state() first to start over.")
    return given, True


_SYNC_STEP = contextlib.nullcontext()  # reusable: entering it does nothing


def _refuse_unsupported(unsupported: dict[str, Any]) -> None:
    for name, value in unsupported.items():
        if name not in _UNSUPPORTED:
            raise TypeError(f"Accelerator() got an unexpected keyword argument {name!r}.")
        if value is not None:
            raise NotImplementedError(
                f"Accelerator({name}=...) needs {_UNSUPPORTED[name]}, which this hasten version does not have yet; "
                f"remove the argument."
            )


def _first_given(*values: Any) -> Any:
    """The first value that is not None: explicit argument, then launch spec, then default."""
    return next(v for v in values if v is not None)


def _engine_plugins(fsdp_plugin: FullyShardedDataParallelPlugin | None, deepspeed_plugin: _DeepSpeedPlugins | None,
                    spec: LaunchSpec) -> tuple[FullyShardedDataParallelPlugin | None, _DeepSpeedPlugins | None]:
    """The FSDP / DeepSpeed plugins: the ones passed, else the ones `hasten launch` decoded from flags or the config
    file, else (as Accelerate's Accelerator) a default one when ``ACCELERATE_USE_FSDP`` / ``ACCELERATE_USE_DEEPSPEED``
    is true — a script started by another launcher that exports them; the plugins read their other variables."""
    if fsdp_plugin is None and spec.fsdp is not None:
        from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin.from_launch_config(spec.fsdp)
    elif fsdp_plugin is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin()
    if deepspeed_plugin is None and spec.deepspeed is not None:
        from .strategies.deepspeed.plugin import DeepSpeedPlugin

        deepspeed_plugin = DeepSpeedPlugin.from_launch_config(spec.deepspeed)
    elif deepspeed_plugin is None and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        from .strategies.deepspeed.plugin import DeepSpeedPlugin

        deepspeed_plugin = DeepSpeedPlugin()
    return fsdp_plugin, deepspeed_plugin


@dataclass
class _Handlers:
    """`kwargs_handlers`, one of each kind (the defaults where none was given)."""

    process_group: InitProcessGroupKwargs = field(default_factory=InitProcessGroupKwargs)
    ddp: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    scaler: GradScalerKwargs = field(default_factory=GradScalerKwargs)
    scheduler: SchedulerKwargs = field(default_factory=SchedulerKwargs)
    profile: ProfileKwargs | None = None
    autocast: AutocastKwargs | None = None
    fp8_recipes: list[Any] = field(default_factory=list)  # hasten.fp8's recipe handlers, for Fp8Setup

    @classmethod
    def split(cls, handlers: list[Any] | None) -> "_Handlers":
        scheduler = next((h for h in handlers or [] if isinstance(h, SchedulerKwargs)), SchedulerKwargs())
        recipes = recipe_handlers(list(handlers or []))
        found = split_kwargs_handlers([h for h in handlers or [] if not isinstance(h, SchedulerKwargs) and h not in recipes])
        return cls(process_group=found.get(InitProcessGroupKwargs, InitProcessGroupKwargs()),
                   ddp=found.get(DistributedDataParallelKwargs, DistributedDataParallelKwargs()),
                   scaler=found.get(GradScalerKwargs, GradScalerKwargs()), scheduler=scheduler,
                   profile=found.get(ProfileKwargs), autocast=found.get(AutocastKwargs), fp8_recipes=recipes)


class Accelerator(ProcessPart, PreparePart, CheckpointPart, TrackerPart, RuntimePart):
    """Run one training loop on 1 or N processes, on CPU or GPUs, in any precision.

    Arguments left as None take the value `hasten launch` passed (its launch
    spec), else the default.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> loader = DataLoader(torch.randn(8, 4), batch_size=4)
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        >>> for x in loader:
        ...     with accelerator.accumulate(model):
        ...         loss = model(x).pow(2).mean()
        ...         accelerator.backward(loss)
        ...         optimizer.step(); optimizer.zero_grad()
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        even_batches: bool | None = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        log_with: Any = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        rng_types: list[Any] | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: Any = None,
        deepspeed_plugins: dict[str, DeepSpeedPlugin] | DeepSpeedPlugin | None = None,
        **unsupported: Any,
    ) -> None:
        _refuse_unsupported({**unsupported, "megatron_lm_plugin": megatron_lm_plugin})
        deepspeed_plugin, own_plugins = _given_deepspeed_plugins(deepspeed_plugin, deepspeed_plugins)
        spec = LaunchSpec.current()  # what `hasten launch` passed: the fallback for every argument left as None
        fsdp_plugin, deepspeed_plugin = _engine_plugins(fsdp_plugin, deepspeed_plugin, spec)
        if deepspeed_plugin is not None and own_plugins:  # Accelerate's start: the (first) plugin is the active one
            activate_deepspeed_plugins(deepspeed_plugin)
        handlers = _Handlers.split(kwargs_handlers)
        # Who and where: the process group and this process's device.
        self.state = AcceleratorState(cpu=cpu, backend=handlers.process_group.backend, timeout=handlers.process_group.timeout)
        self.device: torch.device = self.state.device
        # How loaders are prepared, how often the scheduler steps, what is compiled.
        self._init_loader_settings(dataloader_config or DataLoaderConfiguration(), split_batches, even_batches,
                                   device_placement, rng_types)
        self._scheduler_once_per_step = handlers.scheduler.once_per_optimizer_step
        self.dynamo_plugin = make_dynamo_plugin(dynamo_backend, dynamo_plugin)
        # Where checkpoints and logs go; the trackers to start.
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)
        self._init_tracking(log_with)
        # Gradient accumulation: one state per process, shared with every GradientState().
        # The global batch, decided once (facade/accumulation.py): an elastic launch keeps the one of MAX at any size.
        plugin, accumulation_given, self._elastic, elastic_batch = decide_accumulation(
            gradient_accumulation_plugin, gradient_accumulation_steps, spec, world=self.state.num_processes,
            rank=self.state.process_index, deepspeed_plugin=deepspeed_plugin)
        self.gradient_state = GradientState(plugin)
        self.gradient_state.step = 0  # the accumulation count is this Accelerator's
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        # fp8: the backend and recipe chosen once (hasten.fp8); prepare converts models through it.
        mixed_precision = _first_given(mixed_precision, spec.mixed_precision, "no")
        self._fp8 = Fp8Setup.resolve(handlers.fp8_recipes, mixed_precision, self.device, deepspeed_plugin is not None)
        self.fp8_enabled, self.has_fp8_handler, self.delayed_fp8_autocast = self._fp8.enabled, self._fp8.has_handler, False
        self.ao_recipe_handler, self.te_recipe_handler = self._fp8.ao_recipe_handler, self._fp8.te_recipe_handler
        self.profile_handler: ProfileKwargs | None = handlers.profile
        self.autocast_handler: AutocastKwargs | None = handlers.autocast
        if torch_tp_plugin is not None:  # Accelerate's deprecated plugin: only its tp_size is read
            from .strategies.parallel.tp_size import tp_plugin_parallelism

            parallelism_config = tp_plugin_parallelism(torch_tp_plugin, parallelism_config)
        if parallelism_config is None and spec.parallelism is not None:  # `hasten launch --use_parallelism_config`
            from .strategies.parallel.mesh import ParallelismConfig

            parallelism_config = ParallelismConfig()  # the sizes come from PARALLELISM_CONFIG_*, as in Accelerate
        if parallelism_config is not None:  # as Accelerate: the mesh of the sizes given, then settled for this run
            if parallelism_config.total_size > 1 and not parallelism_config.sp_enabled:  # DeepSpeed SP: its own groups
                parallelism_config.validate(self.state.num_processes)  # "needs N processes", not "no process group"
                parallelism_config.build_device_mesh(self.device.type)
            parallelism_config.settle(self.state.num_processes, fsdp_plugin_given=fsdp_plugin is not None)
        # Strategy and precision are chosen together, once; everything after asks the strategy.
        self.strategy = select_strategy(
            self.device,
            self.state.num_processes,
            mixed_precision,
            ddp_kwargs=handlers.ddp.to_kwargs(),
            ddp_comm_hook=handlers.ddp.register_comm_hook,
            scaler_kwargs=handlers.scaler.to_kwargs(),
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=deepspeed_plugin,
            parallelism_config=parallelism_config,
            gradient_state=self.gradient_state,
            sync_each_batch=plugin.sync_each_batch,
            accumulation_given=accumulation_given,
            elastic_batch=elastic_batch,
        )
        self.precision = self.strategy.precision
        self.scaler = self.precision.scaler
        self.state._record(distributed_type=self.strategy.distributed_type, mixed_precision=self.precision.name,
                           fsdp_plugin=fsdp_plugin, parallelism_config=parallelism_config, deepspeed_plugins=deepspeed_plugin,
                           dynamo_plugin=self.dynamo_plugin)
        self._init_prepared()  # what prepare returns, remembered in order
        self._init_checkpoints()  # last: registered objects, hooks, the batch-boundary watch (a collective)

    # -- what kind of run --------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:
        """The kind of run, as `accelerator.state` records it (Accelerate's: setting the state's changes this too)."""
        return self.state.distributed_type

    @property
    def mixed_precision(self) -> str:
        return self.precision.name

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The fp8 library in use (``FP8BackendType.AO`` for torchao), ``NO`` without fp8."""
        return self._fp8.backend

    @property
    def sync_gradients(self) -> bool:
        """True on steps where gradients are synchronised and the optimizer really steps."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, sync_gradients: bool) -> None:
        # Accelerate lets a script force the flag (e.g. to step on a non-accumulation boundary); the next
        # `accumulate()` sets it again.
        self.gradient_state.sync_gradients = sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {steps!r}.")
        if self._elastic is not None:  # the recipe at MAX processes: this process's share of a step follows
            self._elastic.set_accumulation(steps, self.strategy)
            steps = self._elastic.accumulation_now
        self.gradient_state.num_steps = steps

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True if fp16 loss scaling skipped the last optimizer step (inf/NaN gradients)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- the training step ----------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()` through the strategy: divided by the accumulation steps, scaled under fp16."""
        if not self._seen:
            raise RuntimeError(
                "accelerator.backward was called before accelerator.prepare; "
                "pass your model and optimizer to accelerator.prepare(...) first."
            )
        self.gradient_state.mark_training()
        if self._elastic is not None:  # each micro-batch at its weight, and the fillers a short process owes
            self._elastic.backward(self.strategy, self.gradient_state, loss, **kwargs)
            return
        self.strategy.backward(loss, self.gradient_state.num_steps, **kwargs)

    def _advance_accumulation(self) -> None:
        state = self.gradient_state
        if self._elastic is not None:  # the micro-batches of a step as the group deals them
            self._elastic.advance(state)
        elif state.sync_with_dataloader and state.end_of_dataloader:
            state.step = 0
            state.sync_gradients = True
        else:
            state.step += 1
            state.sync_gradients = state.step % state.num_steps == 0

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Accumulate gradients over `gradient_accumulation_steps` batches before syncing and stepping.

        Inside, backward skips the all-reduce except on the synchronising
        step (or the loader's last batch); the prepared optimizer and
        scheduler step only then. (It returns a ready-made context manager
        rather than running a generator: this is on every training step.)

        Example:
            >>> accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
            >>> with accelerator.accumulate(model):
            ...     accelerator.backward(model(torch.ones(1, 2)).sum())
            >>> accelerator.sync_gradients
            False
        """
        self._advance_accumulation()
        # (a process that owes the step a filler pass synchronises in the filler's backward, not in this one)
        if (self.gradient_state.sync_gradients and not (self._elastic and self._elastic.short_by)) or not models:
            return _SYNC_STEP
        if len(models) == 1:
            return self.strategy.no_sync(models[0])
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.no_sync(model))
        return stack

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation for backward passes in this block."""
        with self.strategy.no_sync(model):
            yield

    def unscale_gradients(self, optimizer: AcceleratedOptimizer | list[AcceleratedOptimizer] | None = None) -> None:
        """Divide gradients by the fp16 loss scale (done once per step; a no-op without fp16)."""
        if optimizer is None:
            optimizers = self._optimizers
        else:
            optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        self.strategy.unscale_gradients(optimizers)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip the gradient norm (after unscaling under fp16). Returns the total norm.

        As in Accelerate it clips whenever it is called, also on accumulation
        steps that do not synchronise (clipping the partial gradient); guard
        it with ``if accelerator.sync_gradients:`` to clip once per step.

        Example:
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
            >>> model(torch.ones(1, 2)).sum().backward()
            >>> float(accelerator.clip_grad_norm_(model.parameters(), 1.0)) > 0
            True
        """
        self._refuse_partial_unscale("clip_grad_norm_")
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type, self._optimizers)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clip each gradient element to [-clip_value, clip_value] (after unscaling under fp16)."""
        self._refuse_partial_unscale("clip_grad_value_")
        self.strategy.clip_grad_value_(parameters, clip_value, self._optimizers)

    def _refuse_partial_unscale(self, name: str) -> None:
        # Under fp16 clipping unscales the gradients; on an accumulation step that does not synchronise, the next
        # backward would add scaled gradients to unscaled ones (Accelerate raises torch's "unscale_() has already
        # been called" one step later).
        if self.scaler is not None and not self.gradient_state.sync_gradients:
            raise RuntimeError(f"accelerator.{name} under fp16 on an accumulation step that does not synchronise "
                               "would unscale a partial gradient; call it under `if accelerator.sync_gradients:`.")

    # -- saving, memory, the end ---------------------------------------------------------
    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save `obj` once, atomically: main process only, or each node's first with `save_on_each_node` (Accelerate's).

        `safe_serialization=True` writes safetensors (a dict of tensors only);
        the default pickles with `torch.save`, as Accelerate does.
        """
        from .checkpointing.files import save as _save  # loaded at the first save

        _save(obj, f, save_on_each_node=self.project_configuration.save_on_each_node,
              safe_serialization=safe_serialization)

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A loader that starts after `num_batches` batches (to resume mid-epoch)."""
        from .data import skip_first_batches

        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop hasten's references to prepared objects, collect garbage and empty device caches.

        Example:
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> model, = accelerator.free_memory(model)
        """
        self._models.clear()
        self._wrappers.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._seen.clear()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return [None for _ in objects]

    clear = free_memory

    def end_training(self) -> None:
        """Finish cleanly: close the trackers, give SIGTERM/SIGUSR1 back, wait for all processes, leave the group.

        A checkpoint still being written in the background is finished (and published) first.
        """
        background = sys.modules.get("hasten.checkpointing.background")  # loaded only by a run that saved
        if background is not None:
            background.wait_pending()
        self._finish_trackers()
        self._boundary_watch.close()
        shutdown_process_group(success=True)

    def __repr__(self) -> str:
        return (
            f"Accelerator(distributed_type={self.distributed_type.value}, num_processes={self.num_processes}, "
            f"process_index={self.process_index}, device={self.device}, mixed_precision={self.mixed_precision!r}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )

