"""The `Accelerator` facade: decides once in `__init__`/`prepare`, then gets out of the way.

It holds no distributed logic of its own: the process layout comes from
`PartialState`, model wrapping from a strategy, casting from a precision
policy, sharding from `hasten.data`, collectives from `hasten.collectives`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from .checkpointing.api import CheckpointingMixin
from .checkpointing.preemption import PROGRESS_ENV, BoundaryWatch
from .checkpointing.project import ProjectConfiguration
from .distributed_helpers import DistributedHelpersMixin
from .runtime_helpers import RuntimeHelpersMixin, make_dynamo_plugin
from .tracking.api import TrackingMixin
from .gradient_state import GradientState
from .launch_spec import LaunchSpec
from .optimizer import AcceleratedOptimizer
from .options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    split_kwargs_handlers,
)
from .saving import save as _save
from .scheduler import AcceleratedScheduler, SchedulerKwargs
from .state import AcceleratorState, shutdown_process_group
from .strategies.select import select_strategy

if TYPE_CHECKING:
    from .data import PreparedDataLoader

__all__ = ["Accelerator"]

_UNSUPPORTED = {
    "megatron_lm_plugin": "Megatron-LM, which needs NVIDIA GPUs and the megatron-core package",
    "torch_tp_plugin": "the older tensor-parallel plugin (pass parallelism_config=ParallelismConfig(tp_size=...))",
    "deepspeed_plugins": "several DeepSpeed plugins in one Accelerator (pass one as deepspeed_plugin=)",
}


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


_SYNC_STEP = contextlib.nullcontext()  # reusable: entering it does nothing


def _first_given(*values: Any) -> Any:
    """The first value that is not None: explicit argument, then launch spec, then default."""
    return next(v for v in values if v is not None)


def _engine_plugins(fsdp_plugin: Any, deepspeed_plugin: Any, spec: LaunchSpec) -> tuple[Any, Any]:
    """The FSDP / DeepSpeed plugins: the ones passed, else the ones `hasten launch` decoded from flags or the config file."""
    if fsdp_plugin is None and spec.fsdp is not None:
        from .strategies.fsdp.plugin import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin.from_launch_config(spec.fsdp)
    if deepspeed_plugin is None and spec.deepspeed is not None:
        from .strategies.deepspeed.plugin import DeepSpeedPlugin

        deepspeed_plugin = DeepSpeedPlugin.from_launch_config(spec.deepspeed)
    return fsdp_plugin, deepspeed_plugin


def _is_prepared_loader(obj: Any) -> bool:
    from .data.loader import PreparedDataLoader

    return isinstance(obj, PreparedDataLoader)


def _is_preparable(obj: Any) -> bool:
    return isinstance(obj, (nn.Module, torch.optim.Optimizer, DataLoader)) or _is_scheduler(obj)


class Accelerator(CheckpointingMixin, TrackingMixin, DistributedHelpersMixin, RuntimeHelpersMixin):
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
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        parallelism_config: Any = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        rng_types: list[Any] | None = None,
        **unsupported: Any,
    ) -> None:
        for name, value in unsupported.items():
            if name not in _UNSUPPORTED:
                raise TypeError(f"Accelerator() got an unexpected keyword argument {name!r}.")
            if value is not None:
                raise NotImplementedError(
                    f"Accelerator({name}=...) needs {_UNSUPPORTED[name]}, which this hasten version does not have yet; "
                    f"remove the argument."
                )
        spec = LaunchSpec.from_env()
        fsdp_plugin, deepspeed_plugin = _engine_plugins(fsdp_plugin, deepspeed_plugin, spec)
        scheduler_kwargs = next((h for h in kwargs_handlers or [] if isinstance(h, SchedulerKwargs)), SchedulerKwargs())
        handlers = split_kwargs_handlers([h for h in kwargs_handlers or [] if not isinstance(h, SchedulerKwargs)])
        pg_kwargs = handlers.get(InitProcessGroupKwargs, InitProcessGroupKwargs())
        self.state = AcceleratorState(cpu=cpu, backend=pg_kwargs.backend, timeout=pg_kwargs.timeout)
        self.device: torch.device = self.state.device

        config = dataloader_config or DataLoaderConfiguration()
        self.split_batches = config.split_batches if split_batches is None else split_batches
        self.even_batches = config.even_batches if even_batches is None else even_batches
        self.dispatch_batches = config.dispatch_batches  # None: iterable datasets are dispatched (Accelerate's default)
        self.device_placement = device_placement
        self.use_stateful_dataloader = config.use_stateful_dataloader
        self.use_seedable_sampler = config.use_seedable_sampler
        self.data_seed = config.data_seed
        self.keyed_shuffle = config.keyed_shuffle
        if config.data_seed is not None and not (config.use_seedable_sampler or config.keyed_shuffle):
            warnings.warn("DataLoaderConfiguration(data_seed=...) applies only with use_seedable_sampler=True (or "
                          "keyed_shuffle=True), as in Accelerate; set one of them or drop data_seed.", stacklevel=2)
        self._non_blocking = config.non_blocking
        # Every prepared loader makes these generators equal on all processes at the start of each pass.
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]
        self._scheduler_once_per_step = scheduler_kwargs.once_per_optimizer_step
        self.dynamo_plugin = make_dynamo_plugin(dynamo_backend, dynamo_plugin)
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)
        self._init_checkpointing()
        self._init_tracking(log_with)

        plugin = gradient_accumulation_plugin
        accumulation_given = not (plugin is None and gradient_accumulation_steps is None and spec.gradient_accumulation_steps is None)
        if plugin is not None and gradient_accumulation_steps is not None:
            raise ValueError("pass gradient_accumulation_steps or gradient_accumulation_plugin, not both.")
        if plugin is None:
            steps = _first_given(gradient_accumulation_steps, spec.gradient_accumulation_steps, 1)
            plugin = GradientAccumulationPlugin(num_steps=steps)
        if not isinstance(plugin.num_steps, int) or plugin.num_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {plugin.num_steps!r}.")
        self.gradient_state = GradientState(plugin)  # one per process, shared with every GradientState()
        self.gradient_state.step = 0  # the accumulation count is this Accelerator's
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer

        # Accelerate's fp8 recipe handlers: hasten drives no fp8 engine yet, so none is ever set.
        self.fp8_recipe_handler = self.ao_recipe_handler = self.te_recipe_handler = self.msamp_recipe_handler = None
        self.profile_handler: ProfileKwargs | None = handlers.get(ProfileKwargs)
        self.autocast_handler: AutocastKwargs | None = handlers.get(AutocastKwargs)
        ddp_handler = handlers.get(DistributedDataParallelKwargs, DistributedDataParallelKwargs())
        # Strategy and precision are chosen together, once; everything after asks the strategy.
        self.strategy = select_strategy(
            self.device,
            self.num_processes,
            _first_given(mixed_precision, spec.mixed_precision, "no"),
            ddp_kwargs=ddp_handler.to_kwargs(),
            ddp_comm_hook=ddp_handler.register_comm_hook,
            scaler_kwargs=handlers.get(GradScalerKwargs, GradScalerKwargs()).to_kwargs(),
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=deepspeed_plugin,
            parallelism_config=parallelism_config,
            gradient_state=self.gradient_state,
            sync_each_batch=plugin.sync_each_batch,
            accumulation_given=accumulation_given,
        )
        self.precision = self.strategy.precision
        self.scaler = self.precision.scaler
        self.state._record(distributed_type=self.strategy.distributed_type, mixed_precision=self.precision.name,
                           fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin, parallelism_config=parallelism_config,
                           dynamo_plugin=self.dynamo_plugin)

        self._models: list[nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._seen: dict[int, Any] = {}  # id -> object, for inputs and outputs of prepare
        # Batch boundaries of the training loader: preemption (with automatic naming) and restart progress.
        watch = BoundaryWatch(self, preemption=self.project_configuration.automatic_checkpoint_naming,
                              progress_file=os.environ.get(PROGRESS_ENV))
        self.gradient_state.boundary_hook = watch if watch.active else None
        self._boundary_watch = watch

    # -- who and where ----------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:
        return self.strategy.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def mixed_precision(self) -> str:
        return self.precision.name

    @property
    def sync_gradients(self) -> bool:
        """True on steps where gradients are synchronised and the optimizer really steps."""
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {steps!r}.")
        self.gradient_state.num_steps = steps

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True if fp16 loss scaling skipped the last optimizer step (inf/NaN gradients)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- prepare ----------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers, in any order.

        Returns the prepared objects in the order given (a single object when
        one was passed). Objects of other types are returned unchanged.
        Models are done first and schedulers last, so each can refer to the
        others whatever order they are passed in.

        Example:
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
        """
        self.state._check_current("distributed_type")  # refuses after AcceleratorState._reset_state(), as the peer
        if device_placement is not None and len(device_placement) != len(args):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one per object.")
        placement = device_placement or [None] * len(args)
        for obj in args:
            self._refuse_prepared(obj)
        preparable = [id(obj) for obj in args if _is_preparable(obj) and not _is_prepared_loader(obj)]
        if len(set(preparable)) < len(preparable):
            raise ValueError("prepare received the same object twice; pass each model/optimizer/loader once.")
        results: list[Any] = list(args)
        # Models and optimizers are set up together: a sharded strategy replaces the parameters optimizers hold.
        loaders = [obj for obj in args if isinstance(obj, DataLoader) and obj.batch_size is not None]
        if loaders:  # an engine (DeepSpeed) sizes its batches from it
            per_process = loaders[0].batch_size // (self.num_processes if self.split_batches else 1)
            self.strategy.observe_micro_batch_size(per_process)
        model_slots = [i for i, obj in enumerate(args) if isinstance(obj, nn.Module)]
        optimizer_slots = [i for i, obj in enumerate(args) if isinstance(obj, torch.optim.Optimizer)]
        prepared_models, prepared_optimizers = self._setup(
            [args[i] for i in model_slots], [placement[i] for i in model_slots], [args[i] for i in optimizer_slots]
        )
        for i, prepared in zip(model_slots + optimizer_slots, prepared_models + prepared_optimizers):
            results[i] = prepared
        for i, obj in enumerate(args):
            if isinstance(obj, DataLoader):
                results[i] = self.prepare_data_loader(obj, device_placement=placement[i])
        for i, obj in enumerate(args):  # last: a scheduler refers to its prepared optimizer
            if _is_scheduler(obj):
                results[i] = self.prepare_scheduler(obj)
        return results[0] if len(results) == 1 else tuple(results)

    def _setup(self, models: list[nn.Module], placements: list[bool | None],
               optimizers: list[torch.optim.Optimizer]) -> tuple[list[nn.Module], list[AcceleratedOptimizer]]:
        """Hand models and optimizers to the strategy together; remember what it returned."""
        for optimizer in optimizers:
            if isinstance(optimizer, AcceleratedOptimizer):
                raise ValueError("this optimizer was prepared by another Accelerator; pass the original torch optimizer.")
        strategy = self.strategy
        # A model is set up for training unless the user asked not to place it (and nothing needs wrapping).
        trained = [(self.device_placement if p is None else p) or self.use_distributed for p in placements]
        to_wrap = [model for model, train in zip(models, trained) if train]
        if strategy.requires_joint_setup and (to_wrap or optimizers) and not (to_wrap and optimizers):
            given = "a model" if to_wrap else "an optimizer"
            raise ValueError(
                f"under {strategy.name} the model and its optimizer are set up together, but prepare got {given} alone; "
                "pass them in the same call: accelerator.prepare(model, optimizer, ...)."
            )
        wrapped, stepped = strategy.setup(to_wrap, optimizers)
        self._compile_models(wrapped)  # torch.compile in place, when a dynamo backend is set
        wrapped_iter = iter(wrapped)
        prepared_models = [next(wrapped_iter) if train else strategy.place_module(model, place=False)
                           for model, train in zip(models, trained)]
        for model, prepared in zip(models, prepared_models):
            self._models.append(prepared)
            self._remember(model, prepared)
        prepared_optimizers = []
        for optimizer, inner in zip(optimizers, stepped):
            prepared = AcceleratedOptimizer(inner, self.gradient_state, strategy)
            self._optimizers.append(prepared)
            self._remember(optimizer, prepared)
            prepared_optimizers.append(prepared)
        return prepared_models, prepared_optimizers

    def _refuse_prepared(self, obj: Any) -> None:
        if _is_prepared_loader(obj):
            return  # a prepared loader passed again comes back unchanged (scripts that re-prepare rely on it)
        if id(obj) in self._seen and self._seen[id(obj)] is obj:
            kind = type(obj).__name__
            raise ValueError(
                f"this {kind} was already passed to or returned by accelerator.prepare; "
                "prepare each object once and keep using the object prepare returned."
            )

    def _remember(self, original: Any, prepared: Any) -> None:
        self._seen[id(original)] = original
        self._seen[id(prepared)] = prepared

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> nn.Module:
        """Set the model up for the strategy (e.g. wrap it in DDP) with its forward under the precision's autocast.

        With `evaluation_mode=True` the model is only placed and cast, never
        wrapped for gradient synchronisation.

        Example:
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.prepare_model(torch.nn.Linear(2, 2)).weight.device.type
            'cpu'
        """
        self._refuse_prepared(model)
        if evaluation_mode:
            place = self.device_placement if device_placement is None else device_placement
            prepared = self.strategy.place_module(model, place)
            self._models.append(prepared)
            self._remember(model, prepared)
            return prepared
        return self._setup([model], [device_placement], [])[0][0]

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> AcceleratedOptimizer:
        """Wrap the optimizer so it steps only on synchronising steps, through the strategy (and fp16 scaler)."""
        self._refuse_prepared(optimizer)
        return self._setup([], [], [optimizer])[1][0]

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None) -> PreparedDataLoader:
        """Shard the loader across processes and move its batches to the device (see `hasten.data`).

        A loader that is already prepared is returned unchanged.
        """
        if _is_prepared_loader(data_loader):
            return data_loader
        self._refuse_prepared(data_loader)
        place = self.device_placement if device_placement is None else device_placement
        from .data import prepare_data_loader  # imported on first use: `from hasten import Accelerator` stays fast

        data_groups, data_group = self.strategy.data_parallel_layout(self.num_processes, self.process_index)

        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=data_groups,
            process_index=data_group,
            split_batches=self.split_batches,
            put_on_device=place,
            rng_types=list(self.rng_types),
            dispatch_batches=self.dispatch_batches,
            even_batches=self.even_batches,
            use_seedable_sampler=self.use_seedable_sampler,
            data_seed=self.data_seed,
            non_blocking=self._non_blocking,
            gradient_state=self.gradient_state,
            keyed_shuffle=self.keyed_shuffle,
        )
        self._dataloaders.append(prepared)
        self._remember(data_loader, prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap the scheduler so it steps only with its optimizer, as Accelerate's does (see `hasten.scheduler`)."""
        self._refuse_prepared(scheduler)
        optimizers = [opt for opt in self._optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        prepared = AcceleratedScheduler(scheduler, optimizers or list(self._optimizers), self.step_scheduler_with_optimizer,
                                        self.split_batches, gradient_state=self.gradient_state,
                                        num_processes=1 if self._scheduler_once_per_step else self.num_processes)
        self._schedulers.append(prepared)
        self._remember(scheduler, prepared)
        return prepared

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        """The user's own module, without DDP (and torch.compile, autocast unless asked to keep them).

        Example:
            >>> accelerator = Accelerator(cpu=True)
            >>> net = torch.nn.Linear(2, 2)
            >>> accelerator.unwrap_model(accelerator.prepare(net)) is net
            True
        """
        from .unwrap import extract_model_from_parallel

        return extract_model_from_parallel(self.strategy.unwrap_model(model), keep_fp32_wrapper, keep_torch_compile)

    # -- the training step ----------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()` through the strategy: divided by the accumulation steps, scaled under fp16."""
        if not self._seen:
            raise RuntimeError(
                "accelerator.backward was called before accelerator.prepare; "
                "pass your model and optimizer to accelerator.prepare(...) first."
            )
        self.gradient_state.mark_training()
        self.strategy.backward(loss, self.gradient_state.num_steps, **kwargs)

    def _advance_accumulation(self) -> None:
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
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
        if self.gradient_state.sync_gradients or not models:
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

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with torch.profiler; with `output_trace_dir`, each process writes ``profile_<rank>.json``.

        Example:
            >>> import tempfile
            >>> accelerator = Accelerator(cpu=True)
            >>> with accelerator.profile(ProfileKwargs(output_trace_dir=tempfile.mkdtemp())) as prof:
            ...     _ = torch.ones(8) * 2
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is not None and handler.on_trace_ready is None:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()

    # -- saving, memory, the end ---------------------------------------------------------
    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool | None = None) -> None:
        """Save `obj` once (main process only), atomically; safetensors for tensor dicts (see `hasten.saving.save`)."""
        if self.is_main_process:
            _save(obj, f, safe_serialization=safe_serialization)

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
        """Finish cleanly: close the trackers, give SIGTERM/SIGUSR1 back, wait for all processes, leave the group."""
        self._finish_trackers()
        self._boundary_watch.close()
        shutdown_process_group(success=True)

    def __repr__(self) -> str:
        return (
            f"Accelerator(distributed_type={self.distributed_type.value}, num_processes={self.num_processes}, "
            f"process_index={self.process_index}, device={self.device}, mixed_precision={self.mixed_precision!r}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )

