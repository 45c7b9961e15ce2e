"""The configuration dataclasses `Accelerator` takes: data loading, gradient accumulation, `torch.compile`.

Example:
    >>> from hasten.options.configuration import GradientAccumulationPlugin
    >>> GradientAccumulationPlugin(num_steps=2).num_steps
    2
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

from ..core.environment import str_to_bool
from .enums import DynamoBackend
from .kwargs import KwargsHandler

__all__ = ["DataLoaderConfiguration", "GradientAccumulationPlugin", "TorchDynamoPlugin", "TORCH_DYNAMO_MODES"]

TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]  # torch.compile's modes, by Accelerate's name

_ENV = "ACCELERATE_DYNAMO_"


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """`torch.compile` settings for prepared models (`Accelerator(dynamo_backend=...)` or `dynamo_plugin=...`).

    `backend` is a `DynamoBackend` or its name in any case ("inductor",
    "eager", ...); "no" turns compilation off. The model is compiled in place
    (`nn.Module.compile`), so its type, its state dict keys and DDP's
    `no_sync` stay as they were. `use_regional_compilation=True` compiles
    each repeated block (an `nn.ModuleList` of one class) and every other
    leaf part instead of the whole model, also in place (see
    `hasten.runtime.regional`): a shorter cold start for a deep transformer. A
    setting left None is read from the `ACCELERATE_DYNAMO_*` variables
    (`BACKEND`, `MODE`, `USE_FULLGRAPH`, `USE_DYNAMIC`,
    `USE_REGIONAL_COMPILATION`) when they are set, as Accelerate does.

    Example:
        >>> TorchDynamoPlugin(backend="eager").to_kwargs()
        {'backend': 'eager'}
        >>> TorchDynamoPlugin(backend="inductor", use_regional_compilation=True).to_kwargs()
        {'backend': 'inductor'}
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        # As the peer: a setting left None comes from the ACCELERATE_DYNAMO_* variables `accelerate launch` exports
        env = {key[len(_ENV):]: value for key, value in os.environ.items() if key.startswith(_ENV)}
        if self.backend is None:
            self.backend = env.get("BACKEND", DynamoBackend.NO)
        if self.mode is None and env.get("MODE"):
            self.mode = env["MODE"]
        for name, key in (("fullgraph", "USE_FULLGRAPH"), ("dynamic", "USE_DYNAMIC"),
                          ("use_regional_compilation", "USE_REGIONAL_COMPILATION")):
            if getattr(self, name) is None and key in env:
                setattr(self, name, bool(str_to_bool(env[key], to_bool=True)))
        try:
            self.backend = DynamoBackend(str(getattr(self.backend, "value", self.backend)).upper())
        except ValueError:
            names = ", ".join(b.value.lower() for b in DynamoBackend)
            raise ValueError(f"TorchDynamoPlugin got backend={self.backend!r}; use one of {names}.") from None
        if self.use_regional_compilation is None:
            self.use_regional_compilation = False

    @property
    def enabled(self) -> bool:
        """True when prepared models are compiled."""
        return self.backend is not DynamoBackend.NO and not self.disable

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for `torch.compile` (only those set)."""
        kwargs: dict[str, Any] = {"backend": cast(DynamoBackend, self.backend).value.lower()}
        for name in ("mode", "fullgraph", "dynamic", "options"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards data loaders (see `hasten.data`).

    Example:
        >>> DataLoaderConfiguration(split_batches=True).even_batches
        True
    """

    split_batches: bool = False
    # True: process 0 alone reads each batch and sends every process its rows. None (Accelerate's default):
    # True for an iterable dataset whose batches are put on the device, False otherwise.
    dispatch_batches: bool | None = None
    even_batches: bool = True
    # Shuffle with the seed data_seed + epoch (as Accelerate's SeedableRandomSampler) instead of torch's RandomSampler
    # draws; either way every process sees the same order and a resume continues it exactly.
    use_seedable_sampler: bool = False
    # The seed of the seedable sampler (default: torch's initial seed); used only with use_seedable_sampler or keyed_shuffle.
    data_seed: int | None = None
    non_blocking: bool = False
    # load_state also restores each prepared loader's position: the next pass yields the rest of the epoch
    use_stateful_dataloader: bool = False
    # hasten's opt-in: shuffle with its keyed O(1)-memory order (seed data_seed, else torch's initial seed). It starts a
    # 1e9-sample loader at once but visits samples in another order than Accelerate. Datasets over 2**27 samples use it
    # anyway (a permutation would not fit comfortably in memory); the log says so once.
    keyed_shuffle: bool = False


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation settings.

    As in Accelerate it is a kwargs handler: `to_kwargs()` (its settings that
    differ from the defaults) is what `GradientState.plugin_kwargs` holds.

    Example:
        >>> GradientAccumulationPlugin(num_steps=4).sync_with_dataloader
        True
        >>> GradientAccumulationPlugin(num_steps=4, sync_each_batch=True).to_kwargs()
        {'num_steps': 4, 'sync_each_batch': True}
    """

    num_steps: int | None = None  # None: 1 step (Accelerate's default, left out of to_kwargs())
    adjust_scheduler: bool = True  # as in Accelerate, only its non-default value reaches GradientState.adjust_scheduler
    sync_with_dataloader: bool = True
    # Synchronise (all-reduce / reduce-scatter) gradients on every batch, not only on the optimizer step:
    # more communication, but under FSDP no full-size unsharded gradient is kept between batches.
    sync_each_batch: bool = False
