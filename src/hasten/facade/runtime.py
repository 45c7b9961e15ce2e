"""The Accelerator's runtime part: autocast blocks, uneven inputs, triggers, profiling, parallelism views, `native_amp`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn

from ..options import AutocastKwargs, DistributedType, ProfileKwargs
from ..options.kwargs import PROFILE_PATTERN_NAME

if TYPE_CHECKING:
    from ..data import PreparedDataLoader
    from ..runtime.precision import PrecisionPolicy
    from ..runtime.accelerator_state import AcceleratorState
    from ..strategies.base import Strategy

__all__ = ["RuntimePart"]

_logger = logging.getLogger("hasten")

def _amp_dtype(precision: str, device_type: str) -> torch.dtype:
    """The autocast dtype Accelerate's `native_amp = True` gives `precision` (fp16, bf16/fp8, else torch's default)."""
    if precision == "fp16":
        return torch.float16
    if precision in ("bf16", "fp8"):
        return torch.bfloat16
    return torch.get_autocast_dtype(device_type)


# The kinds of run `join_uneven_inputs` joins: data parallel over devices of one kind (Accelerate's `multi_device`),
# and over CPU processes, where hasten's DDP joins too (Accelerate's warns there).
_DATA_PARALLEL_KINDS = frozenset({
    DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_MLU, DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA, DistributedType.MULTI_NPU, DistributedType.MULTI_XPU, DistributedType.MULTI_HPU,
    DistributedType.MULTI_NEURON})


class RuntimePart:
    """Autocast blocks, `join_uneven_inputs`, triggers, `trigger_sync_in_backward`, `profile`, `native_amp`.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> accelerator.set_trigger(); accelerator.check_trigger()
        True
    """

    # Shared values this part reads (set once by `Accelerator.__init__`; `native_amp` replaces `precision`).
    state: AcceleratorState
    device: torch.device
    strategy: Strategy
    precision: PrecisionPolicy
    autocast_handler: AutocastKwargs | None
    profile_handler: ProfileKwargs | None
    even_batches: bool
    _dataloaders: list[PreparedDataLoader]

    flag_tensor: torch.Tensor | None = None

    # -- autocast -----------------------------------------------------------------------
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Run a block (e.g. a loss computed outside the model) under the mixed precision policy.

        `autocast_handler` (else the `AutocastKwargs` given in
        `kwargs_handlers`) can disable it or set `cache_enabled`.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True, mixed_precision="bf16")
            >>> with accelerator.autocast():
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.bfloat16
            >>> with accelerator.autocast(AutocastKwargs(enabled=False)):
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.float32
        """
        if isinstance(autocast_handler, bool):  # hasten's earlier signature: autocast(enabled)
            autocast_handler = AutocastKwargs(enabled=autocast_handler)
        handler = autocast_handler or self.autocast_handler or AutocastKwargs()
        return self.precision.autocast(handler.enabled, handler.cache_enabled)

    # -- uneven inputs ----------------------------------------------------------------------
    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Train or evaluate on inputs of different lengths per process with `torch.distributed.algorithms.Join`.

        A process that runs out of batches shadows the collectives of DDP
        models (and `ZeroRedundancyOptimizer`s) in `joinables` until every
        process is done, instead of hanging. `even_batches=False` lets the
        prepared loaders stop unevenly inside the block (the setting is
        restored after); by default the Accelerator's setting applies, and
        Join is enabled only when batches are not evened out.

        As in Accelerate it joins only data-parallel (DDP) runs, which hasten
        also has over CPU processes; under any other distributed kind (FSDP,
        DeepSpeed, or a kind a script set on `accelerator.state`) it warns and
        runs the block as it is, whatever `joinables` holds.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 2))
            >>> with accelerator.join_uneven_inputs([model], even_batches=False):
            ...     _ = model(torch.ones(1, 2))
        """
        kind = self.state.distributed_type
        if not (self.state.use_distributed and kind in _DATA_PARALLEL_KINDS):
            if kind != DistributedType.NO:  # Accelerate's warning (its tests match "only supported for multi-GPU")
                warnings.warn("Joining uneven inputs is only supported for multi-GPU training (data parallel; hasten "
                              f"also joins CPU processes), so `join_uneven_inputs` has no effect under {kind.value}.",
                              stacklevel=3)
            yield
            return
        from torch.distributed.algorithms import Join

        restore: list[tuple[Any, bool]] = []
        if even_batches is not None:
            iterable = False
            for loader in self._dataloaders:
                sampler: Any = getattr(loader, "batch_sampler", None)
                if hasattr(sampler, "even_batches"):
                    restore.append((sampler, sampler.even_batches))
                    sampler.even_batches = even_batches
                else:
                    iterable = True
            if iterable:  # Accelerate's warning, word for word (its tests match it)
                warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                              "given were iterable", stacklevel=3)
        else:
            even_batches = self.even_batches
        try:
            with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
                yield
        finally:
            for sampler, value in restore:
                sampler.even_batches = value

    # -- triggers: one process raises a flag, all learn it ---------------------------------------
    def set_trigger(self) -> None:
        """Raise this process's flag; the next `check_trigger()` returns True on every process.

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).set_trigger()
        """
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called `set_trigger()` since the last check (collective).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).check_trigger()
            False
        """
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        from ..runtime.collectives import reduce

        if int(reduce(self.flag_tensor, "sum").item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Synchronise gradients in the next backward even inside `no_sync` / an accumulation step (DDP models).

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
            >>> with accelerator.no_sync(model), accelerator.trigger_sync_in_backward(model):
            ...     model(torch.ones(1, 2)).sum().backward()
        """
        with self.strategy.sync_in_backward(model):
            yield

    # -- parallelism ------------------------------------------------------------------------
    @property
    def parallelism_config(self) -> Any:
        """The `ParallelismConfig` this Accelerator was given (None without one)."""
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The `ParallelismConfig`'s `DeviceMesh` (Accelerate's dim names and its flattened "dp", "dp_shard_cp",
        "dp_cp"), else the one the engine shards over (FSDP2), else None.

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).torch_device_mesh is None
            True
        """
        config = self.state.parallelism_config
        if config is not None:
            return config.device_mesh
        return self.strategy.device_mesh

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """A loader prepared apart from the model, cut along the sequence under DeepSpeed's Ulysses (sp_size > 1).

        `prepare` already does it for loaders passed with the model; call this
        after `prepare(model, ...)` for one prepared on its own (as transformers'
        Trainer does). With sp_size 1 the loader comes back unchanged.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.deepspeed_ulysses_dl_adapter([1, 2], None)
            [1, 2]
        """
        from ..strategies.deepspeed.ulysses import sequence_parallel_size, ulysses_loader

        if sequence_parallel_size(self.parallelism_config) == 1:
            return dl
        return ulysses_loader(dl, getattr(model, "device", self.device))

    def _mesh_rank(self, dim: str, enabled: bool) -> int:
        if self.state.parallelism_config is None:
            raise RuntimeError(f"the {dim} rank needs a parallelism configuration; pass "
                               "Accelerator(parallelism_config=ParallelismConfig(...)).")
        return self.torch_device_mesh.get_local_rank(dim) if enabled else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's rank in its "tp" group (0 without tensor parallelism), as Accelerate.

        Example:
            >>> from hasten import Accelerator, ParallelismConfig
            >>> Accelerator(cpu=True, parallelism_config=ParallelismConfig()).tensor_parallel_rank
            0
        """
        return self._mesh_rank("tp", self.state.parallelism_config is not None and self.state.parallelism_config.tp_enabled)

    @property
    def data_parallel_rank(self) -> int:
        """This process's rank on the "dp_replicate" dim (0 without replication), as Accelerate.

        Example:
            >>> from hasten import Accelerator, ParallelismConfig
            >>> Accelerator(cpu=True, parallelism_config=ParallelismConfig()).data_parallel_rank
            0
        """
        config = self.state.parallelism_config
        if config is not None and config.dp_replicate_enabled and self.torch_device_mesh is None:
            return self.state.process_index  # sizes all 1, settled to plain DDP over every process
        return self._mesh_rank("dp_replicate", config is not None and config.dp_replicate_enabled)

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's rank on the "dp_shard" dim (0 without sharding), as Accelerate.

        Example:
            >>> from hasten import Accelerator, ParallelismConfig
            >>> Accelerator(cpu=True, parallelism_config=ParallelismConfig()).data_parallel_shard_rank
            0
        """
        config = self.state.parallelism_config
        return self._mesh_rank("dp_shard", config is not None and config.dp_shard_enabled)

    @property
    def context_parallel_rank(self) -> int:
        """This process's rank on the "cp" dim (0 without context parallelism); Accelerate 1.16 raises instead.

        Example:
            >>> from hasten import Accelerator, ParallelismConfig
            >>> Accelerator(cpu=True, parallelism_config=ParallelismConfig()).context_parallel_rank
            0
        """
        config = self.state.parallelism_config
        return self._mesh_rank("cp", config is not None and config.cp_enabled)

    @property
    def pipeline_parallel_rank(self) -> int:
        """Not available, as in Accelerate: a `ParallelismConfig` has no pipeline dimension.

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).pipeline_parallel_rank
            Traceback (most recent call last):
            ...
            NotImplementedError: pipeline_parallel_rank: a ParallelismConfig has no pipeline dimension, as in Accelerate; split a model into stages with hasten.strategies.parallel's prepare_pippy or prepare_pipeline_training instead.
        """
        raise NotImplementedError("pipeline_parallel_rank: a ParallelismConfig has no pipeline dimension, as in "
                                  "Accelerate; split a model into stages with hasten.strategies.parallel's prepare_pippy "
                                  "or prepare_pipeline_training instead.")

    @contextlib.contextmanager
    def maybe_context_parallel(self, buffers: list[torch.Tensor] | None = None, buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[torch.Tensor] | None = None) -> Iterator[None]:
        """Context parallelism around one step when `parallelism_config.cp_size > 1`; otherwise nothing (as Accelerate).

        Each buffer (inputs, labels, position ids) is cut along its sequence dim
        to this rank's load-balanced slice in place, SDPA inside the block
        attends across the whole sequence (torch's ring attention on CUDA,
        gathered-KV attention on CPU), and the buffers not in
        `no_restore_buffers` are put back on exit. Average the loss over
        ``accelerator.torch_device_mesh["dp_cp"]``. Re-enter it every step.

        Example:
            >>> from hasten import Accelerator
            >>> with Accelerator(cpu=True).maybe_context_parallel():   # cp_size 1: runs the body as is
            ...     pass
        """
        config = self.parallelism_config
        if config is not None and config.cp_enabled:
            if getattr(self, "_cp_context", None) is None:
                from ..strategies.parallel.context import context_parallel_context

                self.torch_device_mesh  # noqa: B018 - builds the mesh
                self._cp_context = context_parallel_context(config.submesh("cp"), config.cp_handler)
            with self._cp_context(buffers=buffers, buffer_seq_dims=buffer_seq_dims, no_restore_buffers=no_restore_buffers):
                yield
            return
        if not getattr(self, "_said_no_cp", False):
            self._said_no_cp = True
            _logger.warning("Context parallel training is not enabled: maybe_context_parallel has no effect "
                            "(Accelerate's behaviour without parallelism_config.cp_size > 1).")
        yield

    @property
    def native_amp(self) -> bool:
        """Whether prepared models and `autocast()` run under autocast (Accelerate's attribute, assignable).

        It reads as in Accelerate: True with bf16, fp8, and fp16 on a GPU;
        False in full precision and for fp16 on the CPU (which trains in full
        precision there). Assigning it changes what models prepared afterwards
        and `accelerator.autocast()` do, as in Accelerate: False turns autocast
        off (diffusers' examples do it on Apple's MPS); True turns it on, in the
        precision's dtype, or, with none (``mixed_precision="no"``, or fp16 on
        the CPU), in the dtype Accelerate's autocast takes there: float16 for
        fp16, else torch's default for the device (bfloat16 on the CPU).
        Models prepared before keep their forward; an fp16 loss scaler is made
        (or not) once, at `Accelerator()`.

        Example:
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True, mixed_precision="bf16")
            >>> accelerator.native_amp
            True
            >>> accelerator.native_amp = False
            >>> with accelerator.autocast():
            ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
            torch.float32
        """
        return self.precision.dtype is not None

    @native_amp.setter
    def native_amp(self, enabled: bool) -> None:
        if bool(enabled) == (self.precision.dtype is not None):
            return
        dtype = _amp_dtype(self.precision.name, self.precision.device_type) if enabled else None
        self.precision = dataclasses.replace(self.precision, dtype=dtype)
        self.strategy.precision = self.precision

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with torch.profiler; with `output_trace_dir`, each process writes ``profile_<rank>.json``.

        Example:
            >>> import tempfile
            >>> from hasten import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> with accelerator.profile(ProfileKwargs(output_trace_dir=tempfile.mkdtemp())) as prof:
            ...     _ = torch.ones(8) * 2
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is not None and handler.on_trace_ready is None:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=self.state.process_index)))
        self.state.wait_for_everyone()
