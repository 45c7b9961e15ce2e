"""Sequence parallelism (ALST/Ulysses) through DeepSpeed: the options, the attention wiring, the sharded loader, the loss.

With ``ParallelismConfig(sp_backend="deepspeed", sp_size=N)`` and a
`DeepSpeedPlugin`, each group of N processes trains on one batch at a time,
each process holding 1/N of its sequence. DeepSpeed does the work
(``deepspeed.runtime.sequence_parallel.ulysses_sp``), as in Accelerate:

- `register_ulysses` replaces the model's attention function (sdpa, flash)
  in transformers' registry with DeepSpeed's wrapper, whose all-to-alls turn
  the sequence-sharded query/key/value into head-sharded full sequences and
  back, and returns the ``mpu`` (its process groups) for ``deepspeed.initialize``;
- `ulysses_loader` wraps a prepared loader in DeepSpeed's
  ``UlyssesSPDataLoaderAdapter``: the N processes' batches are gathered and
  each is cut along the sequence, so step k of every process in a group holds
  one shard of the same batch, with ``shift_labels`` made before cutting;
- `sequence_parallel_loss` averages the shards' losses over the group,
  weighted by their counted tokens (a differentiable all-gather).

It runs on CPUs too (gloo has the all-to-all); this module only imports
DeepSpeed and transformers when a run uses them.

Example:
    >>> config = DeepSpeedSequenceParallelConfig(sp_attn_implementation="sdpa")
    >>> config.sp_seq_length_is_variable, config.sp_seq_length
    (True, None)
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError

__all__ = ["DeepSpeedSequenceParallelConfig", "register_ulysses", "sequence_parallel_group", "sequence_parallel_loss",
           "sequence_parallel_size", "ulysses_loader"]

_BUILTIN_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Options of DeepSpeed's Ulysses sequence parallelism, Accelerate's `sp_handler` (its fields, defaults and checks).

    Args:
        sp_seq_length: the sequence length when every batch has the same one; leave None for variable lengths.
        sp_seq_length_is_variable: whether the length may change between batches (default True, or
            ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE``); False needs `sp_seq_length` (or
            ``PARALLELISM_CONFIG_SP_SEQ_LENGTH``).
        sp_attn_implementation: the attention the model runs: "sdpa", "flash_attention_2",
            "flash_attention_3" or a hub flash-attention kernel ("kernels-community/flash-attn2"); None reads
            ``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION`` and, when that is unset too, hasten uses the model's own.
        sp_allow_recurrent_layers: prepare a model with linear-attention (recurrent) layers anyway; only right for
            layers that exchange their state across the sequence-parallel processes themselves (default False, or
            ``PARALLELISM_CONFIG_SP_ALLOW_RECURRENT_LAYERS``).
        sp_disable_in_eval: run the whole sequence on every process in eval mode (default True, or
            ``PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL``); False keeps sequence parallelism on, and the evaluation
            loader must then be sharded as the training one.

    Example:
        >>> DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False, sp_seq_length=256).sp_seq_length
        256
        >>> DeepSpeedSequenceParallelConfig(sp_attn_implementation="eager")
        Traceback (most recent call last):
        ...
        hasten.core.errors.ConfigError: Invalid sp_attn_implementation: 'eager' cannot run under sequence parallelism, which drops the 4-D attention mask eager needs; use 'sdpa' or a flash attention.
    """

    sp_seq_length: int | None = field(default=None)
    sp_seq_length_is_variable: bool | None = field(default=None)
    sp_attn_implementation: str | None = field(default=None)
    sp_allow_recurrent_layers: bool | None = field(default=None)
    sp_disable_in_eval: bool | None = field(default=None)

    def __post_init__(self) -> None:
        if self.sp_allow_recurrent_layers is None:
            allow = os.environ.get("PARALLELISM_CONFIG_SP_ALLOW_RECURRENT_LAYERS", "false")
            self.sp_allow_recurrent_layers = allow.lower() == "true"
        if self.sp_disable_in_eval is None:
            self.sp_disable_in_eval = os.environ.get("PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL", "true").lower() == "true"
        if self.sp_seq_length_is_variable is None:
            variable = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true")
            self.sp_seq_length_is_variable = variable.lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            if "PARALLELISM_CONFIG_SP_SEQ_LENGTH" not in os.environ:
                raise ConfigError("sp_seq_length_is_variable=False needs the fixed length: pass sp_seq_length=... "
                                  "(or set PARALLELISM_CONFIG_SP_SEQ_LENGTH).")
            value = os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH"]
            self.sp_seq_length = None if value == "None" else int(value)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        name = self.sp_attn_implementation
        if name in ("eager", "flex_attention"):
            raise ConfigError(f"Invalid sp_attn_implementation: {name!r} cannot run under sequence parallelism, "
                              f"which drops the 4-D attention mask {name.split('_')[0]} needs; use 'sdpa' or a flash "
                              "attention.")
        if name is not None and name not in _BUILTIN_ATTENTION and not ("/" in name and "flash-attn" in name):
            raise ConfigError(f"Invalid sp_attn_implementation: {name!r} is unknown; use one of "
                              f"{list(_BUILTIN_ATTENTION)} or a hub flash-attention kernel such as "
                              "'kernels-community/flash-attn2'.")


def sequence_parallel_size(parallelism_config: Any) -> int:
    """The Ulysses degree a `ParallelismConfig` asks for (1: off).

    Example:
        >>> sequence_parallel_size(None)
        1
    """
    return int(getattr(parallelism_config, "sp_size", 1) or 1) if parallelism_config is not None else 1


def check_sequence_parallel(parallelism_config: Any, world_size: int) -> int:
    """Check a `ParallelismConfig` asking for sequence parallelism against the run (in `Accelerator()`); its sp_size.

    Example:
        >>> from types import SimpleNamespace
        >>> check_sequence_parallel(SimpleNamespace(sp_size=2, sp_backend="deepspeed", tp_size=1, cp_size=1), 4)
        2
    """
    sp_size = sequence_parallel_size(parallelism_config)
    if sp_size == 1:
        return 1
    if getattr(parallelism_config, "sp_backend", "deepspeed") != "deepspeed":
        raise ConfigError(f"sp_size={sp_size} runs through DeepSpeed only; set sp_backend='deepspeed'.")
    if getattr(parallelism_config, "tp_size", 1) > 1 or getattr(parallelism_config, "cp_size", 1) > 1:
        raise ConfigError("DeepSpeed sequence parallelism cannot be combined with tensor or context parallelism; "
                          "set tp_size=1 and cp_size=1.")
    if world_size % sp_size:
        raise ConfigError(f"sp_size={sp_size} must divide the number of processes ({world_size}); launch a multiple "
                          f"of {sp_size} processes or change sp_size.")
    return sp_size


def _attention_of(model: Any, wanted: str | None, allow_recurrent: bool = False) -> str:
    """The attention implementation to wrap: the one asked for, which must be the model's (DeepSpeed wraps that one)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"sequence parallelism wraps a transformers model's attention, but {type(model).__name__} "
                          "has no `config`; prepare a transformers PreTrainedModel.")
    if not allow_recurrent:
        from ...big_modeling.model_helpers import refuse_recurrent_layers

        refuse_recurrent_layers(model)
    used = getattr(config, "_attn_implementation", None)
    wanted = wanted or used or "sdpa"
    if used is not None and used != wanted:
        raise ConfigError(f"the model runs attention with {used!r} but sp_attn_implementation is {wanted!r}; load the "
                          f"model with attn_implementation={wanted!r} (eager cannot be sharded) or set them equal.")
    if wanted not in _BUILTIN_ATTENTION and not ("/" in wanted and "flash-attn" in wanted):
        raise ConfigError(f"the model's attention {wanted!r} cannot run under sequence parallelism; load it with "
                          "attn_implementation='sdpa' or a flash attention.")
    return wanted


_ORIGINAL_ATTENTION: dict[str, Any] = {}  # transformers' attention functions before Ulysses replaced them


def register_ulysses(model: Any, parallelism_config: Any, micro_batch_size: int | None) -> Any:
    """Wrap the model's attention with DeepSpeed's Ulysses and create its groups; returns the ``mpu`` for the engine.

    Needs the process group (DeepSpeed's ``init_distributed``) and must run
    before ``deepspeed.initialize``; a later Accelerator of the same process gets new groups (DeepSpeed keeps one
    set per process).

    Example:
        >>> # in every process, before deepspeed.initialize(model=model, mpu=mpu, ...):
        >>> # mpu = register_ulysses(model, ParallelismConfig(sp_size=2), micro_batch_size=1)
    """
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as groups
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    handler = getattr(parallelism_config, "sp_handler", None) or DeepSpeedSequenceParallelConfig()
    attention = _attention_of(model, handler.sp_attn_implementation, bool(handler.sp_allow_recurrent_layers))
    # DeepSpeed registers once per process: its groups are globals it asserts unset, and it replaces the
    # attention function in place. A later Accelerator (e.g. a resumed run) starts again from the original.
    groups._SEQUENCE_PARALLEL_GROUP = groups._SEQUENCE_DATA_PARALLEL_GROUP = None
    ALL_ATTENTION_FUNCTIONS[attention] = _ORIGINAL_ATTENTION.setdefault(attention, ALL_ATTENTION_FUNCTIONS[attention])
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=attention,
        sequence_parallel_size=sequence_parallel_size(parallelism_config), micro_batch_size=micro_batch_size or 1,
        seq_length=handler.sp_seq_length, seq_length_is_variable=handler.sp_seq_length_is_variable,
        disable_in_eval=handler.sp_disable_in_eval)  # True by default: evaluation runs each process's full batches


def sequence_parallel_group() -> Any:
    """This process's sequence-parallel process group (DeepSpeed's), once a model was prepared with sp_size > 1.

    Example:
        >>> # after accelerator.prepare(...) with sp_size=2: sequence_parallel_group().size() == 2
    """
    from deepspeed.utils import groups

    return groups._get_sequence_parallel_group()


@functools.cache
def _adapter_class() -> type:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    class SequenceShardedLoader(UlyssesSPDataLoaderAdapter):  # type: ignore[misc]
        """DeepSpeed's adapter, handing out contiguous tensors on the training device.

        DeepSpeed cuts shards as views and moves them with ``.cpu()``, which
        copies from a GPU but is a no-op on the CPU: there the non-contiguous
        ``shift_labels`` view breaks transformers' ``labels.view(-1)``.
        """

        def __next__(self) -> Any:
            batch = super().__next__()
            return {key: value.to(self.device).contiguous() if hasattr(value, "contiguous") else value
                    for key, value in batch.items()}

    return SequenceShardedLoader


def ulysses_loader(loader: Any, device: Any) -> Any:
    """Wrap a (prepared) loader so every process of a sequence-parallel group gets its shard of the same batches.

    Each batch must be a dict with ``input_ids``, ``position_ids`` and
    ``labels`` of shape ``[batch, seq]``, seq divisible by sp_size. Iterating
    hands out ``len(loader) * sp_size`` shards: the group's processes' batches in turn.

    Example:
        >>> # after prepare(model, ...) with sp_size=2: loader = ulysses_loader(prepared_loader, accelerator.device)
    """
    from deepspeed.utils import groups

    return _adapter_class()(loader, sp_rank=groups._get_sequence_parallel_rank(),
                            sp_group=groups._get_sequence_parallel_group(),
                            sp_world_size=groups._get_sequence_parallel_world_size(), device=device)


def _gather_with_grad(value: Any, group: Any) -> Any:
    """Every process's scalar `value`, stacked; the backward hands each its slice of the summed gradients.

    (``torch.distributed.nn.functional.all_gather`` does the same and is deprecated in torch 2.13.)
    """
    import torch
    import torch.distributed as dist

    class GatherScalars(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, local: torch.Tensor) -> torch.Tensor:
            ctx.rank = dist.get_rank(group)
            gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, local.contiguous(), group=group)
            return torch.stack(gathered)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            grad = grad.contiguous().clone()
            dist.all_reduce(grad, group=group)  # every process's loss depends on this shard's
            return grad[ctx.rank]

    return GatherScalars.apply(value)


def sequence_parallel_loss(loss: Any, shift_labels: Any, group: Any = None) -> Any:
    """The loss of the whole sequence from this shard's: shard losses averaged over the group, weighted by their tokens.

    ``loss`` is the mean over this shard's counted tokens (labels not -100);
    the result is the same on every process of the group and differentiable
    (a shard with no counted tokens contributes nothing). It is what
    Accelerate's sequence-parallel example computes inline.

    Example:
        >>> # outputs = model(**batch, labels=batch["shift_labels"])
        >>> # loss = sequence_parallel_loss(outputs.loss, batch["shift_labels"])
    """
    import torch
    import torch.distributed as dist

    group = group if group is not None else sequence_parallel_group()
    losses = _gather_with_grad(loss, group)
    local_tokens = (shift_labels != -100).reshape(-1).sum()
    tokens = [torch.empty_like(local_tokens) for _ in range(dist.get_world_size(group))]
    dist.all_gather(tokens, local_tokens, group=group)
    counts = torch.stack(tokens).to(losses.device)
    counted = torch.where(counts > 0, losses * counts, torch.zeros_like(losses))
    return counted.sum() / counts.sum().clamp(min=1)
