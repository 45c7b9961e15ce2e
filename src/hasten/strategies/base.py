"""The strategy seam: everything that differs between single-device, DDP and sharded engines.

A strategy is chosen once, with its precision (`select_strategy`), and then
owns, for the models and optimizers it set up:

- set-up: models and optimizers are set up *together* (`setup`), because a
  sharded engine replaces the parameters an optimizer holds;
- the hot path: `backward`, `optimizer_step`, `no_sync`, clipping;
- state: full state dicts for the checkpoint layer and `get_state_dict`, or
  (`writes_own_checkpoint_files`) its own sharded files.

The checkpoint layer (`hasten.checkpointing`) never reads a model or an
optimizer directly: it asks the strategy.

The engines meet the seam through typed parts: their plugins (`fsdp/plugin.py`,
`deepspeed/plugin.py`, `parallel/mesh.py`), `AccumulationState` (what an engine
that accumulates on its own reads of the run's `GradientState`) and
`ShardedState` (what a strategy read from its own checkpoint files, handed back
to the same strategy to apply).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol, Sequence, cast

import torch
from torch import nn

from ..options import DistributedType
from ..runtime.precision import PrecisionPolicy, make_precision_policy

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# What `clip_grad_norm_` / `clip_grad_value_` accept (torch's own type): a tensor or an iterable of them.
Parameters = torch.Tensor | Iterable[torch.Tensor]

__all__ = ["Strategy", "AccumulationState", "ShardedState", "clip_by_total_norm", "notice_once"]


class AccumulationState(Protocol):
    """What a strategy that steps at its own accumulation boundary (DeepSpeed) reads and sets of `GradientState`.

    Example:
        >>> from hasten.runtime.gradient_state import GradientState
        >>> state: AccumulationState = GradientState(num_steps=2)
        >>> state.num_steps
        2
    """

    num_steps: int
    sync_gradients: bool


class ShardedState(Protocol):
    """What `Strategy.read_checkpoint_files` read into new memory: opaque to the checkpoint layer, which hands it
    back to the same strategy's `apply_checkpoint_files` once every process has read its part.

    Example:
        >>> state: ShardedState = []  # any object: only the strategy that read it looks inside
    """

_notices_given: set[str] = set()


def notice_once(message: str) -> None:
    """Print a one-line notice about how a setting is run, once per message, on the main process only."""
    import torch.distributed as dist

    if message not in _notices_given and (not dist.is_initialized() or dist.get_rank() == 0):
        _notices_given.add(message)
        print(f"hasten: {message}", flush=True)


def clip_by_total_norm(parameters: Parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip gradients by their total norm, as Accelerate 1.16 computes it; returns the total norm.

    Gradients are grouped by device mesh (plain tensors apart): each group's norm (for ``norm_type=0``, each
    gradient's) is taken where it lives and gathered whole, the total is the `norm_type` norm of those, and each
    gradient is scaled by ``min(1, max_norm / (total + 1e-6))`` on its own shard; ``max_norm=inf`` only measures.

    Example:
        >>> weight = nn.Parameter(torch.zeros(2)); weight.grad = torch.tensor([3.0, 4.0])
        >>> float(clip_by_total_norm([weight], 1.0)), [round(g, 4) for g in weight.grad.tolist()]
        (5.0, [0.6, 0.8])
    """
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    groups: dict[Any, list[Any]] = {}  # parameters whose gradients are on one mesh
    for param in params:
        if param.grad is not None:
            groups.setdefault(getattr(param.grad, "device_mesh", None), []).append(param)

    def whole(norm: torch.Tensor) -> torch.Tensor:
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    if norm_type == 0:  # count the gradients that are not all zero: each one's norm first
        norms = [whole(torch.linalg.vector_norm(p.grad, 0)) for group in groups.values() for p in group]
    elif norm_type == float("inf"):  # a shard may be empty, where torch's max has no identity: taken by hand
        norms = [_largest_magnitude([p.grad for p in group], mesh) for mesh, group in groups.items()]
    else:
        norms = [whole(torch.nn.utils.get_total_norm([p.grad for p in group], norm_type)) for group in groups.values()]
    total = torch.linalg.vector_norm(torch.stack(norms) if norms else torch.zeros(1), norm_type)
    if max_norm == float("inf"):
        return total
    for mesh, group in groups.items():
        if mesh is None:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
            continue
        # a DTensor gradient is scaled shard by shard (one coefficient for every mesh)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        shards = [p.grad.to_local() for p in group]
        torch._foreach_mul_(shards, coefficient.to(shards[0].device))
    return total


def _largest_magnitude(grads: list[Any], mesh: Any) -> torch.Tensor:
    """The infinity norm of gradients on one mesh (or plain ones): the largest local magnitude (0 for an empty
    shard), made the largest of the mesh's with a MAX all-reduce over each of its dims."""
    shards = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    present = [shard.detach().abs().max() for shard in shards if shard.numel()]
    largest = torch.stack(present).max() if present else torch.zeros((), dtype=shards[0].dtype, device=shards[0].device)
    if mesh is not None:
        import torch.distributed as dist

        for dim in range(mesh.ndim):
            dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    return largest


class Strategy:
    """Base strategy: one process, one device; subclasses override what differs.

    Example:
        >>> strategy = Strategy(torch.device("cpu"))
        >>> [model], [] = strategy.setup([nn.Linear(2, 2)], [])
        >>> model.weight.device.type
        'cpu'
    """

    name: ClassVar[str] = "single"
    #: True when an optimizer needs its model in the same `prepare` call (a model alone is the strategy's to refuse).
    requires_joint_setup: ClassVar[bool] = False
    #: True when `setup` replaces the models' parameters and points the optimizers at the new ones itself (sharding).
    replaces_parameters: ClassVar[bool] = False
    #: True when the strategy writes models and optimizers into checkpoints itself (sharded files).
    writes_own_checkpoint_files: ClassVar[bool] = False
    #: True when saving needs every process (state gathered or sharded); False: the main process holds it all.
    state_needs_every_process: ClassVar[bool] = False
    #: The sharded checkpoints (by the writing strategy's `name`) `read_checkpoint_files` reads, on any number of
    #: processes. FSDP's are DCP directories, which torch reads into any sharding or into whole tensors, so every
    #: strategy but DeepSpeed reads them: an FSDP checkpoint of N processes resumes on M, or on one unsharded.
    reads_sharded_from: ClassVar[frozenset[str]] = frozenset({"fsdp"})

    @property
    def peer_engine_saves_models(self) -> bool:
        """True where Accelerate's engine saves and loads the models itself (FSDP, DeepSpeed): there its save
        pre-hooks see no weights to take over and its load pre-hooks no models (hasten's hooks see the same)."""
        return False

    def peer_model(self, original: nn.Module, prepared: nn.Module) -> nn.Module:
        """What Accelerate keeps in `accelerator._models` for a model (its save/load hooks receive that list).

        The user's own module, not its wrapper (Accelerate appends the model
        before wrapping it in DDP); an engine whose wrapper replaces the model
        there (FSDP, DeepSpeed's engine) returns `prepared`. hasten keeps the
        wrapper it needs itself, whatever this returns.
        """
        return original

    def __init__(self, device: torch.device, precision: PrecisionPolicy | None = None) -> None:
        self.device = device
        self.precision = precision if precision is not None else make_precision_policy("no", device)
        # With accumulation: synchronise gradients on every batch anyway (less memory, more communication).
        self.sync_each_batch = False
        # Parameters replaced during set-up (old -> new), so an optimizer built before `prepare` follows them.
        self._replaced_params: dict[int, nn.Parameter] = {}

    # -- what kind of run ----------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.NO

    # -- set-up (prepare) ------------------------------------------------------------------
    def setup(self, models: Sequence[nn.Module],
              optimizers: Sequence[torch.optim.Optimizer]) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        """Set up models, then the optimizers over their (possibly replaced) parameters."""
        prepared_models = [self.setup_module(model) for model in models]
        prepared_optimizers = [self.setup_optimizer(optimizer) for optimizer in optimizers]
        return prepared_models, prepared_optimizers

    def observe_micro_batch_size(self, batch_size: int | None) -> None:
        """The per-process batch size of the training loader, told before set-up (an engine may size buffers by it)."""

    def setup_module(self, model: nn.Module) -> nn.Module:
        """Cast the forward for the precision and place the model (subclasses wrap it)."""
        self.cast_forward(model)
        return model.to(self.device)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point the optimizer at parameters that set-up replaced; returns the optimizer to step."""
        self._follow_replaced_params(optimizer)
        return optimizer

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The `DeviceMesh` the engine shards over (None for engines without one)."""
        return None

    def place_module(self, model: nn.Module, place: bool = True) -> nn.Module:
        """For evaluation only: cast the forward and place the model, never wrap it."""
        self.cast_forward(model)
        return model.to(self.device) if place else model

    def cast_forward(self, model: nn.Module) -> None:
        """Run the model's forward under the precision's autocast (once per model).

        A forward a library set on the instance (TRL's fused-loss forward) is
        wrapped too, as Accelerate does; only hasten's own wrapper is not.
        """
        if self.precision.dtype is not None and not hasattr(vars(model).get("forward"), "__wrapped_forward__"):
            model.forward = self.precision.wrap_forward(model.forward)

    def _record_replaced_params(self, before: dict[str, nn.Parameter], model: nn.Module) -> None:
        after = dict(model.named_parameters())
        for name, old in before.items():
            new = after.get(name)
            if new is not None and new is not old:
                self._replaced_params[id(old)] = new

    def _follow_replaced_params(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._replaced_params:
            return
        groups = optimizer.param_groups
        olds = [p for group in groups for p in group["params"] if id(p) in self._replaced_params]
        if not olds:
            return
        if any(p in optimizer.state for p in olds):
            raise ValueError(
                "this optimizer already holds state for the model's parameters, which the sharded set-up replaced; "
                "prepare the model and the optimizer before the first optimizer step."
            )
        for group in groups:
            group["params"] = [self._newest(p) for p in group["params"]]

    def _newest(self, param: nn.Parameter) -> nn.Parameter:
        # A parameter can be replaced twice (fp8 conversion, then sharding): follow the chain to the end.
        while id(param) in self._replaced_params:
            param = self._replaced_params[id(param)]
        return param

    # -- the hot path --------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, accumulation_steps: float = 1, **kwargs: Any) -> None:
        """`loss.backward()`, divided by the accumulation steps and scaled under fp16."""
        if accumulation_steps > 1:
            loss = loss / accumulation_steps
        scaler = self.precision.scaler
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> tuple[Any, bool]:
        """Step the optimizer (through the fp16 scaler when there is one); returns (result, step was skipped)."""
        return self.precision.step(optimizer, closure)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which backward does not synchronise gradients across processes."""
        return contextlib.nullcontext()

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which the next backward synchronises gradients even inside `no_sync` (nothing to do here)."""
        return contextlib.nullcontext()

    # -- an elastic run's filler passes (`hasten.facade.elastic`) ---------------------------------
    def needs_fillers(self, model: nn.Module) -> bool:
        """Must every process run as many forward and backward passes in a step (the engine communicates in each)?

        An elastic run whose size does not divide a step's micro-batches then
        gives a process with one micro-batch fewer a zero-weight filler pass.
        One process needs none.
        """
        return False

    def filler_step(self, model: nn.Module, zero_loss: Callable[[], torch.Tensor]) -> None:
        """A filler pass: the forward `zero_loss` runs, then a backward that synchronises the step's gradients."""
        with self.sync_on(model):
            zero_loss().backward()

    def sync_on(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context in which a forward and backward synchronise gradients, even inside `no_sync`."""
        return contextlib.nullcontext()

    def unscale_gradients(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Divide gradients by the fp16 loss scale, once per step (a no-op without fp16)."""
        for optimizer in optimizers:
            self.precision.unscale(optimizer)

    def clip_grad_norm_(self, parameters: Parameters, max_norm: float, norm_type: float,
                        optimizers: Sequence[torch.optim.Optimizer]) -> torch.Tensor:
        """Unscale, then clip the total gradient norm of `parameters` (`clip_by_total_norm`); returns that norm."""
        self.unscale_gradients(optimizers)
        return clip_by_total_norm(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Parameters, clip_value: float, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.unscale_gradients(optimizers)
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def shard_sequences(self, loader: Any) -> Any:
        """The loader a step reads when sequence parallelism cuts each batch along the sequence (here: `loader`)."""
        return loader

    def data_parallel_layout(self, num_processes: int, process_index: int) -> tuple[int, int]:
        """(number of data-parallel groups, this process's group): what data loaders shard over.

        Processes that split one model's tensors (tensor parallel) must see the same batches.
        """
        return num_processes, process_index

    # -- state for checkpoints ------------------------------------------------------------
    # Every process calls these (a sharded strategy gathers); only the returned values differ.
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict of a prepared model, keyed as the user's own module names it."""
        return self.unwrap_model(model).state_dict()

    def model_state_dict_shapes(self, model: nn.Module) -> dict[str, Any]:
        """Objects with the full shapes a saved state dict must match (no copy is made)."""
        return self.unwrap_model(model).state_dict()

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
        self.unwrap_model(model).load_state_dict(state_dict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
        optimizer.load_state_dict(state_dict)

    def model_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This process's accumulated gradients (local: before the synchronising step they differ per process)."""
        return {name: p.grad for name, p in self.unwrap_model(model).named_parameters() if p.grad is not None}

    def load_model_gradients(self, model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
        """Set every gradient to the saved one (None where none was saved)."""
        for name, param in self.unwrap_model(model).named_parameters():
            saved = gradients.get(name)
            param.grad = None if saved is None else saved.to(device=param.device, dtype=param.dtype)

    # -- sharded checkpoint files (only when `writes_own_checkpoint_files`) -------------------
    def save_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
        """Write this process's part of models and optimizers under `directory`; returns {relative path: size}."""
        raise NotImplementedError(f"{type(self).__name__} saves full state dicts through the checkpoint layer")

    def begin_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                               optimizers: Sequence[torch.optim.Optimizer]) -> Callable[[], dict[str, int]]:
        """(`save_state(async_save=True)`.) Copy this process's part off the live state now; the returned call,
        run on the writer thread, writes it under `directory` and returns {relative path: size}.

        An engine that cannot save in the background raises `CheckpointError` saying why.
        """
        from ..core.errors import CheckpointError

        raise CheckpointError(f"save_state(async_save=True) is not available under {self.name}, which writes its own "
                              "checkpoint files; call save_state without async_save.")

    def read_checkpoint_files(self, directory: Path, models: Sequence[nn.Module],
                              optimizers: Sequence[torch.optim.Optimizer]) -> ShardedState:
        """Read and check this process's part into new memory; nothing live is changed.

        Here: FSDP's DCP directories, read into this strategy's own tensors (whole ones without FSDP).
        """
        from .fsdp import checkpoint as fsdp_checkpoint

        pairs = [(self._model_stepped_by(models, o), getattr(o, "optimizer", o)) for o in optimizers]
        return fsdp_checkpoint.read_sharded(directory, list(models), pairs)

    def apply_checkpoint_files(self, contents: ShardedState) -> None:
        """Put what `read_checkpoint_files` returned into the live models and optimizers."""
        from .fsdp import checkpoint as fsdp_checkpoint

        fsdp_checkpoint.apply_sharded(cast("fsdp_checkpoint.ShardedContents", contents))

    @staticmethod
    def _model_stepped_by(models: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> nn.Module:
        inner = getattr(optimizer, "optimizer", optimizer)
        params = {id(p) for group in inner.param_groups for p in group["params"]}
        for model in models:
            if any(id(p) in params for p in model.parameters()):
                return model
        raise ValueError("an optimizer in the checkpoint steps no prepared model's parameters; prepare the model "
                         "and build the optimizer on its parameters, as in the run that saved it.")
