"""The Accelerator's prepare part: `prepare` and its family, how loaders are prepared, compiling prepared models.

What `prepare` returns is remembered here (`_models`, `_optimizers`,
`_schedulers`, `_dataloaders`): checkpoints, clipping and `free_memory`
read those lists.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, Callable, TypeGuard

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..options import DataLoaderConfiguration, DistributedType, TorchDynamoPlugin
from ..runtime.modules import named_parameters_of, replaced_parameters
from ..runtime.optimizer import AcceleratedOptimizer
from ..runtime.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    from .elastic import ElasticRun
    from ..data import PreparedDataLoader
    from ..fp8.setup import Fp8Setup
    from ..runtime.gradient_state import GradientState
    from ..runtime.accelerator_state import AcceleratorState
    from ..strategies.base import Strategy

__all__ = ["PreparePart", "make_dynamo_plugin"]


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


def _is_prepared_loader(obj: Any) -> TypeGuard[PreparedDataLoader]:
    from ..data import PreparedDataLoader, SkipDataLoader

    # a SkipDataLoader (skip_first_batches of an iterable loader) is still to prepare, as under Accelerate
    return isinstance(obj, PreparedDataLoader) and not isinstance(obj, SkipDataLoader)


def _mark_prepared(obj: Any) -> None:
    """Accelerate's mark on what prepare returned; libraries test it (`getattr(obj, "_is_accelerate_prepared", False)`)."""
    obj._is_accelerate_prepared = True


def _is_preparable(obj: Any) -> bool:
    return isinstance(obj, (nn.Module, torch.optim.Optimizer, DataLoader)) or _is_scheduler(obj)


def make_dynamo_plugin(dynamo_backend: Any = None, dynamo_plugin: TorchDynamoPlugin | None = None) -> TorchDynamoPlugin:
    """The compile settings from `Accelerator(dynamo_backend=..., dynamo_plugin=...)` (not both).

    Example:
        >>> make_dynamo_plugin("eager").enabled, make_dynamo_plugin().enabled
        (True, False)
    """
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("pass dynamo_backend or dynamo_plugin, not both.")
    if dynamo_plugin is not None:
        if not isinstance(dynamo_plugin, TorchDynamoPlugin):
            raise TypeError(f"dynamo_plugin must be a TorchDynamoPlugin, got a {type(dynamo_plugin).__name__}.")
        return dynamo_plugin
    return TorchDynamoPlugin(backend=dynamo_backend)  # None: ACCELERATE_DYNAMO_BACKEND, else no compile


class PreparePart:
    """`prepare` (models, optimizers, loaders, schedulers in any order), `unwrap_model`, `dataloader_config`.

    `dataloader_config` is the `DataLoaderConfiguration` given (or made), kept
    as Accelerate keeps it: the loader settings (`split_batches`,
    `even_batches`, ...) read it at each prepare.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model, optimizer = accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD([torch.ones(1)], lr=0.1))
        >>> type(optimizer).__name__
        'AcceleratedOptimizer'
    """

    # Shared values this part reads (set once by `Accelerator.__init__`).
    dataloader_config: DataLoaderConfiguration  # set by `_init_loader_settings`; replaceable, as in Accelerate
    state: AcceleratorState
    device: torch.device
    strategy: Strategy  # sets models and optimizers up; where a loader's process sits among the data groups
    gradient_state: GradientState
    dynamo_plugin: TorchDynamoPlugin
    step_scheduler_with_optimizer: bool
    _scheduler_once_per_step: bool
    _fp8: Fp8Setup
    _elastic: ElasticRun | None

    @property
    def _scheduler_processes(self) -> int:
        """How many times a prepared scheduler advances per optimizer step: Accelerate's number of processes (an
        elastic run's at MAX, so the schedule follows optimizer steps at any size)."""
        return self._elastic.scheduler_steps if self._elastic is not None else self.state.num_processes

    def _init_loader_settings(self, config: DataLoaderConfiguration, split_batches: bool | None, even_batches: bool | None,
                              device_placement: bool, rng_types: list[Any] | None) -> None:
        """How loaders are prepared: the configuration (kept as given, as Accelerate keeps it), with `split_batches` /
        `even_batches` passed directly winning."""
        direct = {name: value for name, value in (("split_batches", split_batches), ("even_batches", even_batches))
                  if value is not None}
        # Accelerate keeps the object itself and reads it at each prepare: a library that sets a field on it later
        # (TRL: `accelerator.dataloader_config.dispatch_batches = False`) changes the loaders prepared after.
        self.dataloader_config = dataclasses.replace(config, **direct) if direct else config
        self.device_placement = device_placement
        if config.data_seed is not None and not (config.use_seedable_sampler or config.keyed_shuffle):
            warnings.warn("DataLoaderConfiguration(data_seed=...) applies only with use_seedable_sampler=True (or "
                          "keyed_shuffle=True), as in Accelerate; set one of them or drop data_seed.", stacklevel=3)
        # Every prepared loader makes these generators equal on all processes at the start of each pass.
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]

    def _init_prepared(self) -> None:
        """What `prepare` returned, in order (read by checkpoints, clipping, `free_memory`).

        `_models` holds what Accelerate's holds, because libraries read it and
        its save/load hooks receive it: the user's module under DDP (Accelerate
        appends it before wrapping), the wrapper under FSDP, the engine under
        DeepSpeed (`Strategy.peer_model`). hasten keeps the wrapper it needs
        for each entry in `_wrappers`.
        """
        self._models: list[nn.Module] = []
        self._wrappers: dict[int, nn.Module] = {}  # id of a `_models` entry -> the prepared model, where they differ
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._seen: dict[int, Any] = {}  # id -> object, for inputs and outputs of prepare

    def _prepared_model(self, entry: nn.Module) -> nn.Module:
        """The prepared (wrapping) model behind an entry of `_models`."""
        return self._wrappers.get(id(entry), entry)

    def _keep_model(self, original: nn.Module, prepared: nn.Module) -> None:
        entry = self.strategy.peer_model(original, prepared)
        self._models.append(entry)
        if entry is not prepared:
            self._wrappers[id(entry)] = prepared
        self._remember(original, prepared)
        _mark_prepared(prepared)

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers, in any order.

        Returns the prepared objects in the order given (a single object when
        one was passed). Objects of other types are returned unchanged.
        Models are done first and schedulers last, so each can refer to the
        others whatever order they are passed in.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
        """
        self.state._check_current("distributed_type")  # refuses after AcceleratorState._reset_state(), as the peer
        if device_placement is not None and len(device_placement) != len(args):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one per object.")
        placement: list[bool | None] = list(device_placement) if device_placement else [None] * len(args)
        results: list[Any] = list(args)
        # An object prepare returned before comes back as it is (as in Accelerate, whose Trainer prepares again
        # on each try of its batch-size search); the rest is prepared now.
        fresh = [not self._already_prepared(obj) for obj in args]
        args = tuple(obj if new else None for obj, new in zip(args, fresh))
        preparable = [id(obj) for obj in args if _is_preparable(obj)]
        if len(set(preparable)) < len(preparable):
            raise ValueError("prepare received the same object twice; pass each model/optimizer/loader once.")
        self._fp8.prepare(tuple(a for a in args if a is not None), self.strategy.distributed_type is DistributedType.FSDP,
                          self.strategy)  # Linear -> Float8Linear
        # Models and optimizers are set up together: a sharded strategy replaces the parameters optimizers hold.
        batch_sizes = [obj.batch_size for obj in args if isinstance(obj, DataLoader) and obj.batch_size is not None]
        if batch_sizes:  # an engine (DeepSpeed) sizes its batches from the first loader's
            per_process = batch_sizes[0] // (self.state.num_processes if self.split_batches else 1)
            self.strategy.observe_micro_batch_size(per_process)
        model_slots = [i for i, obj in enumerate(args) if isinstance(obj, nn.Module)]
        optimizer_slots = [i for i, obj in enumerate(args) if isinstance(obj, torch.optim.Optimizer)]
        prepared_models, prepared_optimizers = self._setup(
            [args[i] for i in model_slots], [placement[i] for i in model_slots], [args[i] for i in optimizer_slots]
        )
        for i, prepared in zip(model_slots + optimizer_slots, [*prepared_models, *prepared_optimizers]):
            results[i] = prepared
        for i, obj in enumerate(args):
            if isinstance(obj, DataLoader):
                results[i] = self.prepare_data_loader(obj, device_placement=placement[i])
                if model_slots:  # as Accelerate: under Ulysses the loaders prepared with the model are cut along the sequence
                    results[i] = self.strategy.shard_sequences(results[i])
        for i, obj in enumerate(args):  # last: a scheduler refers to its prepared optimizer
            if _is_scheduler(obj):
                results[i] = self.prepare_scheduler(obj)
        return results[0] if len(results) == 1 else tuple(results)

    def _already_prepared(self, obj: Any) -> bool:
        """True for an object prepare returned before (Accelerate's `_is_accelerate_prepared` mark): it is kept as it is.

        As Accelerate, such an object is added back to its list if it left it. An
        object hasten replaced by a wrapper (a module under DDP, a torch optimizer)
        passed again is refused: wrapping it twice would synchronise its gradients twice.
        """
        if _is_prepared_loader(obj) and not getattr(obj, "_is_accelerate_prepared", False):
            return True  # e.g. from skip_first_batches: already sharded, returned as it is
        if getattr(obj, "_is_accelerate_prepared", False):
            kept: list[Any] = (self._models if isinstance(obj, nn.Module) else self._optimizers
                               if isinstance(obj, torch.optim.Optimizer) else self._dataloaders
                               if isinstance(obj, DataLoader) else self._schedulers if _is_scheduler(obj) or
                               isinstance(obj, AcceleratedScheduler) else [])
            if _is_preparable(obj) or isinstance(obj, AcceleratedScheduler):
                if not any(obj is entry for entry in kept):
                    kept.append(obj)
            return True
        if id(obj) in self._seen and self._seen[id(obj)] is obj:
            kind = type(obj).__name__
            raise ValueError(
                f"this {kind} was already passed to accelerator.prepare, which returned a wrapper of it; "
                "keep using the object prepare returned (passing that again is fine)."
            )
        return False

    def _setup(self, models: list[nn.Module], placements: list[bool | None],
               optimizers: list[torch.optim.Optimizer]) -> tuple[list[nn.Module], list[AcceleratedOptimizer]]:
        """Hand models and optimizers to the strategy together; remember what it returned."""
        self._check_quantized(models)
        for optimizer in optimizers:
            if isinstance(optimizer, AcceleratedOptimizer):
                raise ValueError("this optimizer was prepared by another Accelerator; pass the original torch optimizer.")
        strategy = self.strategy
        # A model is set up for training unless the user asked not to place it (and nothing needs wrapping).
        trained = [(self.device_placement if p is None else p) or self.state.use_distributed for p in placements]
        to_wrap = [model for model, train in zip(models, trained) if train]
        if strategy.requires_joint_setup and optimizers and not to_wrap:  # a model alone is the strategy's to judge
            raise ValueError(
                f"under {strategy.name} an optimizer is set up with its model, but prepare got an optimizer alone; "
                "pass them in the same call: accelerator.prepare(model, optimizer, ...)."
            )
        config = self.state.parallelism_config
        if config is not None and config.cp_enabled:  # as Accelerate's _prepare_cp: CP attention takes no masks
            from ..strategies.parallel.context import drop_attention_masks

            for model in to_wrap:
                drop_attention_masks(model)
        # placing a model may replace its parameters (torch's overwrite-on-conversion, some devices): as Accelerate
        # 1.16, optimizers are pointed at the new ones (a sharding engine keeps its own record of them)
        before = named_parameters_of(*to_wrap) if optimizers and not strategy.replaces_parameters else {}
        wrapped, stepped = strategy.setup(to_wrap, optimizers)
        if before:
            self._remap_optimizer_parameters(before, *wrapped, *stepped)
        self._compile_models(wrapped)  # torch.compile in place, when a dynamo backend is set
        if self._elastic is not None:  # its training passes and filler passes follow these models
            for model in wrapped:
                self._elastic.trains(model, self.state.num_processes > 1 and strategy.needs_fillers(model))
        wrapped_iter = iter(wrapped)
        prepared_models = [next(wrapped_iter) if train else strategy.place_module(model, place=False)
                           for model, train in zip(models, trained)]
        for model, prepared in zip(models, prepared_models):
            self._keep_model(model, prepared)
        prepared_optimizers: list[AcceleratedOptimizer] = []
        for optimizer, inner in zip(optimizers, stepped):
            prepared_optimizer = AcceleratedOptimizer(inner, gradient_state=self.gradient_state, strategy=strategy)
            self._optimizers.append(prepared_optimizer)
            if self._elastic is not None and self._elastic.live is not None:  # a live run steps on commit only
                prepared_optimizer.commit_gate = self._elastic.live.commit
            self._remember(optimizer, prepared_optimizer)
            _mark_prepared(prepared_optimizer)
            prepared_optimizers.append(prepared_optimizer)
        return prepared_models, prepared_optimizers

    def _get_named_parameters(self, *args: Any, drop_refs: bool = False) -> dict[str, Any]:
        """Accelerate's helper: the parameters of the models among `args` by name (their ids with `drop_refs`)."""
        return named_parameters_of(*args, ids=drop_refs)

    def _remap_optimizer_parameters(self, old_named_params: dict[str, Any], *args: Any) -> None:
        """Accelerate's helper: point the optimizers among `args` at the parameters that replaced `old_named_params`."""
        mapping = replaced_parameters(old_named_params, *args)
        for obj in args if mapping else ():
            if isinstance(obj, AcceleratedOptimizer):
                obj._switch_parameters(mapping)
            elif isinstance(obj, torch.optim.Optimizer):
                for group in obj.param_groups:
                    group["params"] = [mapping.get(p, p) for p in group["params"]]

    def _check_quantized(self, models: list[nn.Module]) -> None:
        """8-bit/4-bit models spread by a device map cannot move: refuse placements they cannot train in."""
        from ..big_modeling.quantized import check_quantized_placement

        for model in models:
            check_quantized_placement(model, self.device, self.strategy.distributed_type is not DistributedType.NO)

    def _remember(self, original: Any, prepared: Any) -> None:
        self._seen[id(original)] = original
        self._seen[id(prepared)] = prepared

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> nn.Module:
        """Set the model up for the strategy (e.g. wrap it in DDP) with its forward under the precision's autocast.

        With `evaluation_mode=True` the model is only placed and cast, never
        wrapped for gradient synchronisation.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.prepare_model(torch.nn.Linear(2, 2)).weight.device.type
            'cpu'
        """
        if self._already_prepared(model):
            return model
        if evaluation_mode:
            self._check_quantized([model])
            place = self.device_placement if device_placement is None else device_placement
            prepared = self.strategy.place_module(model, place)
            self._models.append(prepared)
            self._remember(model, prepared)
            _mark_prepared(prepared)
            return prepared
        return self._setup([model], [device_placement], [])[0][0]

    def verify_device_map(self, model: nn.Module) -> bool:
        """True when `model` (or a submodule) was dispatched over several devices by big-model loading (an `hf_device_map` of 2+ entries).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).verify_device_map(torch.nn.Linear(2, 2))
            False
        """
        return any(len(getattr(m, "hf_device_map", None) or ()) > 1 for m in model.modules())

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass for prepared LOMO / AdaLomo optimizers (the `lomo-optim` package).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).lomo_backward(torch.ones(()), 0.1)
            Traceback (most recent call last):
            ...
            ValueError: lomo_backward needs a LOMO or AdaLomo optimizer passed to prepare(); none was prepared, so call accelerator.backward(loss) instead.
        """
        if learning_rate is None:
            raise ValueError("lomo_backward needs the learning rate; pass learning_rate=<float>.")
        lomo: list[Any] = [opt.optimizer for opt in self._optimizers if type(opt.optimizer).__name__ in ("Lomo", "AdaLomo")]
        if not lomo:
            raise ValueError("lomo_backward needs a LOMO or AdaLomo optimizer passed to prepare(); none was prepared, "
                             "so call accelerator.backward(loss) instead.")
        for optimizer in lomo:
            optimizer.fused_backward(loss, learning_rate)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> AcceleratedOptimizer:
        """Wrap the optimizer so it steps only on synchronising steps, through the strategy (and fp16 scaler)."""
        if self._already_prepared(optimizer):
            return optimizer  # type: ignore[return-value]
        return self._setup([], [], [optimizer])[1][0]

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable[..., Any] | None = None) -> PreparedDataLoader:
        """Shard the loader across processes and move its batches to the device (see `hasten.data`).

        A loader that is already prepared is returned unchanged. `slice_fn_for_dispatch`
        cuts each process's part out of a dispatched batch (with ``dispatch_batches=True``).
        """
        if self._already_prepared(data_loader):
            return data_loader  # type: ignore[return-value]
        place = self.device_placement if device_placement is None else device_placement
        from ..data import prepare_data_loader  # imported on first use: `from hasten import Accelerator` stays fast

        data_groups, data_group = self.strategy.data_parallel_layout(self.state.num_processes, self.state.process_index)

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
            non_blocking=self.non_blocking,
            gradient_state=self.gradient_state,
            keyed_shuffle=self.keyed_shuffle,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_stateful_dataloader=self.use_stateful_dataloader,
            elastic=self._elastic,
        )
        self._dataloaders.append(prepared)
        self._remember(data_loader, prepared)
        _mark_prepared(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap the scheduler so it steps only with its optimizer, as Accelerate's does (see `hasten.runtime.scheduler`)."""
        if self._already_prepared(scheduler):
            return scheduler
        optimizers = [opt for opt in self._optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        prepared = AcceleratedScheduler(scheduler, optimizers or list(self._optimizers), self.step_scheduler_with_optimizer,
                                        self.split_batches, gradient_state=self.gradient_state,
                                        num_processes=1 if self._scheduler_once_per_step else self._scheduler_processes)
        self._schedulers.append(prepared)
        self._remember(scheduler, prepared)
        _mark_prepared(prepared)
        return prepared

    # -- torch.compile ----------------------------------------------------------------------
    def _compile_models(self, models: list[nn.Module]) -> None:
        """Compile each prepared model in place (`nn.Module.compile`) when a dynamo backend is set.

        In place, after the strategy wrapped it: DDP's and FSDP2's hooks
        still run, the state dict keys stay. Regional compilation compiles the
        repeated blocks and the other leaves the same way (`hasten.runtime.regional`).
        A model compiled already (by the user, whole or by regions) is left as it is.
        """
        from ..runtime.regional import compile_in_place, compile_regions_fsdp2, has_compiled_regions
        from ..runtime.unwrap import is_compiled_module

        plugin = self.dynamo_plugin
        if not plugin.enabled:
            return
        for model in models:
            inner = self.strategy.unwrap_model(model)
            if (is_compiled_module(model) or is_compiled_module(inner) or inner._compiled_call_impl is not None
                    or has_compiled_regions(inner)):
                continue
            if plugin.use_regional_compilation:
                compile_regions_fsdp2(inner, **plugin.to_kwargs())
            else:
                compile_in_place(inner, **plugin.to_kwargs())

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        """The user's own module, without DDP (and torch.compile, autocast unless asked to keep them).

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> net = torch.nn.Linear(2, 2)
            >>> accelerator.unwrap_model(accelerator.prepare(net)) is net
            True
        """
        from ..runtime.unwrap import extract_model_from_parallel

        return extract_model_from_parallel(self.strategy.unwrap_model(model), keep_fp32_wrapper, keep_torch_compile)

    # -- how loaders are prepared: read from `dataloader_config` at each prepare, as Accelerate ---------------
    @property
    def split_batches(self) -> bool:
        """Whether each batch is split across processes (`DataLoaderConfiguration.split_batches`).

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.dataloader_config.split_batches = True   # loaders prepared from now on split
            >>> accelerator.split_batches
            True
        """
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether process 0 reads every batch and sends each process its rows (None: for iterable datasets)."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last batch is completed so every process gets one (settable, as in Accelerate)."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether shuffling uses a sampler seeded by `data_seed` + epoch."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """Whether batches are moved to the device without blocking (`DataLoaderConfiguration.non_blocking`)."""
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether loaders are torchdata `StatefulDataLoader`s."""
        return self.dataloader_config.use_stateful_dataloader

    @property
    def data_seed(self) -> int | None:
        """The seedable sampler's seed (hasten's name for `dataloader_config.data_seed`)."""
        return self.dataloader_config.data_seed

    @property
    def keyed_shuffle(self) -> bool:
        """hasten's opt-in keyed shuffle (`DataLoaderConfiguration.keyed_shuffle`)."""
        return self.dataloader_config.keyed_shuffle
