"""DeepSpeed ZeRO 1/2/3: the model becomes a `DeepSpeedEngine`, which owns backward, the step and the shards.

How the Accelerator's loop maps onto the engine (as the peer library does it):

- `accelerator.backward(loss)` marks the accumulation boundary from
  `sync_gradients`, runs `engine.backward(loss)` (DeepSpeed divides the loss
  by its own accumulation steps, so hasten does not divide again) and
  `engine.step()`, which on a boundary clips, steps, and zeroes gradients;
- the prepared optimizer's `step()`/`zero_grad()` therefore do nothing;
- `clip_grad_norm_` returns the norm the engine measured (it clips by the
  config's `gradient_clipping`).

Several models (Accelerate's named plugins, ``deepspeed_plugins={...}``):
each `prepare` call sets its model up under the plugin selected at that
moment (`accelerator.state.select_deepspeed_plugin(name)`). A model with
its optimizer becomes the engine `backward` drives (one per Accelerator, as
Accelerate's `deepspeed_engine_wrapped`); a model alone becomes an engine
without optimizer that only runs forward (a frozen teacher or reference
model, ZeRO-3 partitioned; stages 1-2 need an optimizer, so there it is
refused, and `prepare_model(model, evaluation_mode=True)` leaves it unwrapped).

Checkpoints are sharded: every process writes its own fp32 master partition
and optimizer state (tensors and plain values only, read back with
``weights_only=True``), never DeepSpeed's pickled checkpoint files. A run
with another number of processes re-partitions them as it loads
(`checkpoint.reshard`). A model no optimizer trains (forward-only engine,
unwrapped model) is saved as its full weights, gathered one parameter at a
time (`checkpoint.gather_weights`); its index is its place among the
prepared models, as Accelerate's ``pytorch_model`` / ``pytorch_model_1``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence, cast

import torch
from torch import nn

from ...checkpointing.commit import fsync_path
from .config import require_deepspeed
from .dummies import DummyOptim
from .engine_config import ElasticBatch
from .plugin import DeepSpeedPlugin
from ...options import DistributedType
from ...runtime.precision import PrecisionPolicy, check_precision_supported
from ..base import AccumulationState, Parameters, ShardedState, Strategy

if TYPE_CHECKING:
    from ..parallel.mesh import ParallelismConfig

__all__ = ["DeepSpeedStrategy"]

# fp8 trains on a bf16 engine; autocast lets fp32 inputs meet the bf16 weights, Float8Linear does the fp8 products
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
CHECKPOINT_FOLDER = "deepspeed"
FORMAT_VERSION = 1


def _shard_name(index: int, rank: int) -> str:
    return f"{CHECKPOINT_FOLDER}/model_{index}_rank_{rank}.pt"


def _weights_name(index: int) -> str:
    """The file of a model no optimizer trains (full weights, written by process 0)."""
    return f"{CHECKPOINT_FOLDER}/model_{index}_weights.pt"


def _init_distributed(device: torch.device) -> None:
    """DeepSpeed needs a process group even for one process; hasten's own group is reused when there is one."""
    import torch.distributed as dist

    deepspeed = require_deepspeed()
    if not dist.is_initialized():  # one process, no launcher: a private group of one
        from torch.distributed.elastic.utils.distributed import get_free_port

        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(get_free_port()))
    deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl", verbose=False)


class DeepSpeedStrategy(Strategy):
    """Runs the model as a DeepSpeed engine under ZeRO stage 0-3 (see module doc).

    Example:
        >>> strategy = DeepSpeedStrategy.create(torch.device("cpu"), 1, "no", DeepSpeedPlugin(zero_stage=3),
        ...                                     gradient_state=None, parallelism_config=None)
        >>> strategy.name, strategy.distributed_type.value, strategy.zero_stage
        ('deepspeed', 'DEEPSPEED', 3)
    """

    name: ClassVar[str] = "deepspeed"
    requires_joint_setup: ClassVar[bool] = True
    replaces_parameters: ClassVar[bool] = True
    writes_own_checkpoint_files: ClassVar[bool] = True
    state_needs_every_process: ClassVar[bool] = True
    reads_sharded_from: ClassVar[frozenset[str]] = frozenset({"deepspeed"})

    def __init__(self, device: torch.device, precision: PrecisionPolicy, plugin: DeepSpeedPlugin,
                 gradient_state: AccumulationState | None,
                 world_size: int, plugins: Mapping[str, DeepSpeedPlugin] | None = None) -> None:
        super().__init__(device, precision)
        self.plugin = plugin  # the trained engine's plugin (until it exists: the one active at creation)
        self.plugins = dict(plugins) if plugins is not None else None  # Accelerate's named plugins, if given
        self.gradient_state = gradient_state
        self.world_size = world_size
        self.accumulation_steps = 1
        self.accumulation_given = True
        self.micro_batch_size: int | None = None
        self.engine: Any = None  # the engine with an optimizer, which `backward` drives
        self.engines: list[Any] = []  # every engine, in the order prepare made them
        self.engine_config: dict[str, Any] | None = None
        self._step_skipped = False
        self._pending_micro_steps = False  # gradients accumulated since the last optimizer step
        self._warned_clip = False
        self.sp_size = 1  # Ulysses sequence parallel degree (ParallelismConfig.sp_size)
        self.parallelism_config: Any = None
        self.sp_mpu: Any = None  # DeepSpeed's sequence-parallel groups once the engine exists
        self.elastic_batch: ElasticBatch | None = None  # an elastic run's engine accumulation and recipe

    @classmethod
    def create(cls, device: torch.device, world_size: int, mixed_precision: str,
               plugin: DeepSpeedPlugin | Mapping[str, DeepSpeedPlugin], *,
               gradient_state: AccumulationState | None, parallelism_config: ParallelismConfig | None,
               accumulation_given: bool = True, elastic_batch: ElasticBatch | None = None) -> "DeepSpeedStrategy":
        """Check the plugin(s) against the Accelerator's settings now (in `Accelerator()`), not at `prepare`.

        `plugin` is one plugin or Accelerate's named ones (a dict); the one
        selected now (else the first) is checked for the accumulation steps.
        """
        named = dict(plugin) if isinstance(plugin, Mapping) else None
        values: list[Any] = list(named.values()) if named is not None else [plugin]
        if not values:
            raise ValueError("deepspeed_plugins is an empty dict; give at least one named DeepSpeedPlugin.")
        for one in values:
            if not isinstance(one, DeepSpeedPlugin):
                raise TypeError(f"deepspeed_plugin must be a hasten DeepSpeedPlugin, got {type(one).__name__}.")
        given: list[DeepSpeedPlugin] = values
        active = next((one for one in given if one.selected), given[0])
        from .ulysses import check_sequence_parallel

        sp_size = check_sequence_parallel(parallelism_config, world_size)
        # under Ulysses the data-parallel sizes only describe how ZeRO's processes are counted
        if sp_size == 1 and parallelism_config is not None and getattr(parallelism_config, "needs_sharded_engine", False):
            raise ValueError("DeepSpeed and a ParallelismConfig that shards or splits tensors cannot be combined; "
                             "drop one of deepspeed_plugin or parallelism_config.")
        check_precision_supported(mixed_precision, device.type)
        if mixed_precision == "fp16" and device.type == "cpu":  # DeepSpeed's CPU accelerator has no fp16 engine
            raise ValueError("DeepSpeed cannot train in fp16 on CPUs; use mixed_precision='bf16' or 'no' there.")
        for one in given:  # every plugin runs in the Accelerator's precision (Accelerate sets it on each)
            one.check_mixed_precision(mixed_precision)
            one.set_mixed_precision(mixed_precision)  # its fp16/bf16 sections, which libraries read before prepare
        # DeepSpeed casts the model and scales the loss itself: no GradScaler. Autocast only lets fp32 inputs
        # meet the 16-bit weights DeepSpeed made.
        precision = PrecisionPolicy(name=mixed_precision, device_type=device.type, dtype=_DTYPES.get(mixed_precision))
        strategy = cls(device, precision, active, gradient_state, world_size, plugins=named)
        strategy.sp_size, strategy.parallelism_config = sp_size, parallelism_config
        strategy.accumulation_given = accumulation_given
        if elastic_batch is not None:  # an elastic run decided the batch (the config's numbers included) already
            strategy.elastic_batch = elastic_batch
            strategy.accumulation_steps = elastic_batch.engine_accumulation
            return strategy
        steps = gradient_state.num_steps if gradient_state is not None else 1
        strategy.accumulation_steps = active.resolve_accumulation(steps, given=accumulation_given)
        if gradient_state is not None:
            gradient_state.num_steps = strategy.accumulation_steps  # an Accelerator given no number follows the file
        return strategy

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.DEEPSPEED

    @property
    def peer_engine_saves_models(self) -> bool:
        return True  # Accelerate's DeepSpeed engine writes and reads the model itself

    def peer_model(self, original: nn.Module, prepared: nn.Module) -> nn.Module:
        return prepared  # Accelerate's `_models` holds the DeepSpeedEngine

    @property
    def zero_stage(self) -> int:
        return int(self.plugin.zero_stage or 0)

    def observe_micro_batch_size(self, batch_size: int | None) -> None:
        """Per-process batch size of the training DataLoader (fills train_micro_batch_size_per_gpu)."""
        if batch_size is not None and self.micro_batch_size is None:
            self.micro_batch_size = int(batch_size)

    # -- set-up ---------------------------------------------------------------------------
    def current_plugin(self) -> DeepSpeedPlugin:
        """The plugin a model prepared now is set up under: of named plugins the selected one, else the one plugin."""
        if self.plugins is None:
            return self.plugin
        return next((plugin for plugin in self.plugins.values() if plugin.selected), self.plugin)

    def setup(self, models: Sequence[nn.Module],
              optimizers: Sequence[torch.optim.Optimizer]) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if not models and not optimizers:
            return [], []
        if len(models) != 1 or len(optimizers) > 1:
            raise ValueError(f"under DeepSpeed prepare takes one model (with its optimizer, or alone for a forward-only "
                             f"engine) per call, got {len(models)} model(s) and {len(optimizers)} optimizer(s); "
                             "prepare each model in its own call.")
        plugin = self.current_plugin()
        if not optimizers:
            return [self._setup_forward_only(models[0], plugin)], []
        if self.engine is not None:
            raise ValueError("this Accelerator already trains a DeepSpeed engine, the one accelerator.backward drives; "
                             "prepare the second trained model with a second Accelerator() (it shares named "
                             "deepspeed_plugins; with one plugin pass it deepspeed_plugin=...).")
        return self._setup_trained(models[0], optimizers[0], plugin)

    def _setup_trained(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                       plugin: DeepSpeedPlugin) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        deepspeed = require_deepspeed()
        _init_distributed(self.device)
        if plugin is not self.plugin and self.elastic_batch is None:  # named plugins: trained under another one
            steps = plugin.resolve_accumulation(self.accumulation_steps, given=self.accumulation_given)
            if steps != self.accumulation_steps and self.gradient_state is not None:
                self.gradient_state.num_steps = steps  # an Accelerator given no number follows the file
            self.plugin, self.accumulation_steps = plugin, steps
        dummy_optim = optimizer if isinstance(optimizer, DummyOptim) else None
        dummy = dummy_optim is not None
        scheduler = dummy_optim.scheduler if dummy_optim is not None else None
        config = plugin.build_engine_config(
            # a sequence-parallel group trains on one batch: ZeRO's data-parallel processes are world / sp_size
            world_size=self.world_size // self.sp_size, mixed_precision=self.precision.name, device_type=self.device.type,
            micro_batch_size=self.micro_batch_size, client_optimizer=not dummy, optimizer=optimizer, scheduler=scheduler,
            elastic=self.elastic_batch)
        self.engine_config = config
        self.cast_forward(model)
        plugin.set_moe_leaf_modules(model)  # MoE layers gathered whole under ZeRO-3, as Accelerate's prepare does
        kwargs: dict[str, Any] = {"model": model.to(self.device), "config": config}
        if dummy_optim is not None:
            kwargs["model_parameters"] = dummy_optim.params
            if scheduler is not None and scheduler.lr_scheduler_callable is not None:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        else:
            kwargs["optimizer"] = optimizer
        if self.sp_size > 1:  # Accelerate's order: attention wrapped and groups made before the engine
            from .ulysses import register_ulysses

            self.sp_mpu = kwargs["mpu"] = register_ulysses(model, self.parallelism_config, self.micro_batch_size)
        engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(**kwargs)
        self.engine = engine
        self.engines.append(engine)
        if scheduler is not None:
            scheduler.engine_scheduler = engine_scheduler
        # The prepared optimizer wraps the torch optimizer DeepSpeed steps (its param_groups carry the lr a
        # scheduler sets); stepping goes through the engine.
        base = getattr(engine_optimizer, "optimizer", engine_optimizer)
        if not isinstance(base, torch.optim.Optimizer):
            base = engine_optimizer
        return [engine], [base]

    def _setup_forward_only(self, model: nn.Module, plugin: DeepSpeedPlugin) -> nn.Module:
        """A model prepared without an optimizer: an engine that runs forward only (Accelerate's
        `deepspeed.initialize` with no optimizer), e.g. a frozen teacher partitioned by ZeRO-3."""
        stage = int(plugin.zero_stage or 0)
        if stage in (1, 2):  # DeepSpeed asserts "zero stage N requires an optimizer"
            raise ValueError(f"prepare got a model without an optimizer under a ZeRO stage {stage} DeepSpeedPlugin, "
                             "whose engine needs one; select a ZeRO-3 plugin for a forward-only engine "
                             "(accelerator.state.select_deepspeed_plugin(name)), pass its optimizer too, or leave it "
                             "unwrapped with accelerator.prepare_model(model, evaluation_mode=True).")
        deepspeed = require_deepspeed()
        _init_distributed(self.device)
        plugin.resolve_accumulation(self.accumulation_steps, given=False)  # fills "auto"; nothing steps here
        config = plugin.build_engine_config(
            world_size=self.world_size // self.sp_size, mixed_precision=self.precision.name, device_type=self.device.type,
            micro_batch_size=self.micro_batch_size, client_optimizer=None)
        self.cast_forward(model)
        plugin.set_moe_leaf_modules(model)
        engine, *_ = deepspeed.initialize(model=model.to(self.device), config=config)
        self.engines.append(engine)
        return engine

    def shard_sequences(self, loader: Any) -> Any:
        """Under Ulysses (sp_size > 1), DeepSpeed's adapter: each process of a group gets its shard of one batch."""
        if self.sp_size == 1 or self.engine is None:
            return loader
        from .ulysses import ulysses_loader

        return ulysses_loader(loader, self.device)

    # -- the hot path -------------------------------------------------------------------------
    def _engine_for(self) -> Any:
        if self.engine is None:
            raise RuntimeError("the DeepSpeed engine does not exist yet; pass the model and optimizer to accelerator.prepare first.")
        return self.engine

    def backward(self, loss: torch.Tensor, accumulation_steps: float = 1, **kwargs: Any) -> None:
        """Boundary from `sync_gradients`, then `engine.backward` (it divides by its accumulation) and `engine.step`."""
        engine = self._engine_for()
        if self.elastic_batch is not None:  # the engine divides by its accumulation; the micro-batch counts P / M
            loss = loss * (self.accumulation_steps / accumulation_steps)
        elif accumulation_steps != self.accumulation_steps:
            raise ValueError(f"gradient_accumulation_steps changed to {accumulation_steps} after the DeepSpeed engine was built "
                             f"with {self.accumulation_steps}; set it before accelerator.prepare.")
        sync = self.gradient_state.sync_gradients if self.gradient_state is not None else True
        engine.set_gradient_accumulation_boundary(sync)
        engine.backward(loss, **kwargs)
        engine.step()
        if sync:
            self._step_skipped = bool(getattr(engine.optimizer, "overflow", False))
        self._pending_micro_steps = not sync

    def needs_fillers(self, model: nn.Module) -> bool:
        """ZeRO reduces gradients in every backward (stage 2 and 3) or gathers in every forward (3): every process
        runs as many micro-steps."""
        return True

    def filler_step(self, model: nn.Module, zero_loss: Callable[[], torch.Tensor]) -> None:
        """The engine's last micro-step of the step, at the accumulation boundary: it reduces and steps."""
        engine = self._engine_for()
        loss = zero_loss()
        engine.set_gradient_accumulation_boundary(True)
        engine.backward(loss)
        engine.step()
        self._step_skipped = bool(getattr(engine.optimizer, "overflow", False))
        self._pending_micro_steps = False

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> tuple[Any, bool]:
        """The engine already stepped in `backward`; report whether fp16 overflow skipped that step."""
        if closure is not None:
            raise ValueError("under DeepSpeed optimizer.step(closure) is not supported: the engine steps in "
                             "accelerator.backward; call optimizer.step() without a closure.")
        return None, self._step_skipped

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        """Nothing to do: the engine zeroes gradients after each optimizer step."""

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the boundary flag set in backward tells ZeRO when to reduce

    def unscale_gradients(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """DeepSpeed unscales inside its step."""

    def clip_grad_norm_(self, parameters: Parameters, max_norm: float, norm_type: float,
                        optimizers: Sequence[torch.optim.Optimizer]) -> torch.Tensor:
        """The global gradient norm the engine measured at its last step (it clips by `gradient_clipping`)."""
        engine = self._engine_for()
        configured = float((self.engine_config or {}).get("gradient_clipping", 0.0))
        if not self._warned_clip and float(max_norm) != configured:
            self._warned_clip = True
            warnings.warn(f"under DeepSpeed the engine clips gradients to its config's gradient_clipping={configured}, not to "
                          f"max_norm={max_norm}; set gradient_clipping in the DeepSpeedPlugin or config to change it.",
                          stacklevel=3)
        norm = engine.get_global_grad_norm()
        if norm is None:
            return torch.tensor(float("nan"))
        return norm.detach().float().cpu() if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))

    def clip_grad_value_(self, parameters: Parameters, clip_value: float,
                         optimizers: Sequence[torch.optim.Optimizer]) -> None:
        raise NotImplementedError("DeepSpeed clips by norm only; use accelerator.clip_grad_norm_ and set gradient_clipping "
                                  "in the DeepSpeed config.")

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return getattr(model, "module", model) if any(model is engine for engine in self.engines) else model

    # -- full state ------------------------------------------------------------------------
    def _gathered(self, module: nn.Module, modifier_rank: int | None = None) -> contextlib.AbstractContextManager[Any]:
        """All of `module`'s ZeRO-3 parameters gathered on every process (a no-op below stage 3)."""
        params = [p for p in module.parameters() if hasattr(p, "ds_id")]
        if not params:
            return contextlib.nullcontext()
        deepspeed = require_deepspeed()
        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict, gathered from every process under ZeRO-3 (every process must call it)."""
        module = self.unwrap_model(model)
        with self._gathered(module):
            return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}

    def model_state_dict_shapes(self, model: nn.Module) -> dict[str, Any]:
        module = self.unwrap_model(model)
        shapes: dict[str, Any] = dict(module.state_dict(keep_vars=True))
        for name, param in module.named_parameters():
            if hasattr(param, "ds_shape") and name in shapes:
                shapes[name] = torch.empty(param.ds_shape, device="meta", dtype=param.dtype)
        return shapes

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
        """Load full weights into the module and the optimizer's fp32 master copy (every process calls it)."""
        module = self.unwrap_model(model)
        with self._gathered(module, modifier_rank=0):
            module.load_state_dict(state_dict)
        optimizer = getattr(self.engine, "optimizer", None) if model is self.engine else None
        if optimizer is not None and hasattr(optimizer, "refresh_fp32_params"):
            optimizer.refresh_fp32_params()

    def optimizer_state_dict(self, optimizer: Any) -> dict[str, Any]:
        return optimizer.state_dict()  # this process's partition (the full state exists only as shards)

    def load_optimizer_state_dict(self, optimizer: Any, state_dict: dict[str, Any]) -> None:
        optimizer.load_state_dict(state_dict)

    def model_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {}  # ZeRO keeps gradients in its own buffers; save_state refuses to run mid-accumulation instead

    def load_model_gradients(self, model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
        """Nothing to restore: checkpoints are taken at optimizer-step boundaries only."""

    # -- sharded checkpoint files -------------------------------------------------------------
    def save_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
        from .checkpoint import gather_weights, save_shard, save_weights

        if self._pending_micro_steps and self.elastic_batch is None:  # (elastic: saved as at the step's start)
            raise RuntimeError("save_state was called in the middle of a gradient accumulation cycle, whose partial "
                               "gradients DeepSpeed keeps in its own buffers; call it right after an optimizer step.")
        files = {}
        writer = self._rank() == 0
        for index, model in enumerate(models):
            if model is self.engine:
                name = _shard_name(index, self._rank())
                path = directory / name
                path.parent.mkdir(parents=True, exist_ok=True)
                save_shard(self.engine, path, write_extras=writer)
            else:  # trained by no optimizer: its full weights (every process takes part in ZeRO-3's gathers)
                weights = gather_weights(self.unwrap_model(model), writer)
                if not writer:
                    continue
                name = _weights_name(index)
                path = directory / name
                path.parent.mkdir(parents=True, exist_ok=True)
                save_weights(weights, path)
            fsync_path(path)
            files[name] = path.stat().st_size
        return files

    def begin_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                               optimizers: Sequence[torch.optim.Optimizer]) -> Callable[[], dict[str, int]]:
        """Refused: DeepSpeed 0.19's only background writer cannot be waited on and published by hasten."""
        from ...core.errors import CheckpointError

        # DeepSpeed's decoupled checkpoint engine (0.19) writes through its async_io op (libaio, DeepNVMe) in a
        # spawned process and commits only inside the engine's next optimizer step, with a barrier: nothing a writer
        # thread can wait on before hashing and publishing the folder.
        raise CheckpointError("save_state(async_save=True) is not available under DeepSpeed, whose only background "
                              "writer (the decoupled checkpoint engine) finishes a save inside its next optimizer step "
                              "and needs the async_io op (libaio), so hasten cannot check and publish it; call "
                              "save_state without async_save (Accelerate also saves synchronously there).")

    def read_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> ShardedState:
        from .checkpoint import check_shard, read_shard, read_weights, reshard

        contents: list[tuple[Any, ...]] = []
        for index, model in enumerate(models):
            if model is not self.engine:
                module = self.unwrap_model(model)
                contents.append(("weights", module, read_weights(directory / _weights_name(index), module)))
                continue
            first = read_shard(directory / _shard_name(index, 0), self.engine, check_partitions=False)
            saved_world, rank = int(first["world_size"]), self._rank()
            if saved_world == self.world_size:
                mine = first if rank == 0 else read_shard(directory / _shard_name(index, rank), self.engine, saved_world,
                                                          check_partitions=False)
            else:  # another number of processes: every saved shard, put together and cut along this run's partitions
                others = [read_shard(directory / _shard_name(index, r), self.engine, saved_world, check_partitions=False)
                          for r in range(1, saved_world)]
                mine = reshard([first, *others], self.engine)
            check_shard(_shard_name(index, rank), mine, self.engine)
            contents.append(("engine", mine, first["extras"]))
        return contents

    def apply_checkpoint_files(self, contents: ShardedState) -> None:
        from .checkpoint import apply_shard, apply_weights

        for kind, *parts in cast(list, contents):
            if kind == "engine":
                apply_shard(self.engine, *parts)
            else:
                apply_weights(*parts)
        self._pending_micro_steps = False

    @staticmethod
    def _rank() -> int:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0
