"""Context parallelism: each process of the ``cp`` mesh dim holds a slice of every sequence.

`Accelerator.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers)`
runs its block through the context made by :func:`context_parallel_context`:

- on CUDA (and any non-CPU device) it is torch's own
  ``torch.distributed.tensor.experimental.context_parallel`` (ring attention
  inside SDPA), with ``cp_handler.cp_comm_strategy`` given to torch's
  ``set_rotate_method`` -- exactly what Accelerate does;
- on CPU torch's context parallel raises (``NotImplementedError: Operator
  aten._scaled_dot_product_flash_attention_for_cpu.default does not have a
  sharding strategy registered``), so :func:`gathered_kv_context_parallel`
  stands in: the same buffer sharding, and SDPA replaced by attention whose
  query stays local while key and value are all-gathered (autograd-aware), with
  the causal mask built from every token's true position. That is exact, not
  memory-saving: it is there so CPU runs and tests give the 1-process numbers.

Both shard the buffers as torch does: with causal load balancing ("head-tail")
when the sequence length divides by ``2 * cp_size`` -- rank ``i`` of ``N`` holds
chunks ``i`` and ``2N-1-i`` of ``2N`` -- else contiguous slices; buffers are
restored on exit unless named in `no_restore_buffers`.

Example:
    >>> from hasten.strategies.parallel.context import load_balanced_positions
    >>> load_balanced_positions(8, cp_size=2, cp_rank=0).tolist()   # chunks 0 and 3 of 4
    [0, 1, 6, 7]
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...core.errors import ConfigError
from .context_config import TorchContextParallelConfig

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["TorchContextParallelConfig", "load_balanced_positions", "shard_buffers", "restore_buffers",
           "gathered_kv_attention", "gathered_kv_context_parallel", "context_parallel_context", "drop_attention_masks"]

def load_balanced_positions(seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """The sequence positions rank `cp_rank` holds, in the order it holds them (torch's default balancer).

    Head-tail (chunks ``i`` and ``2N-1-i`` of ``2N``) when `seq_len` divides by
    ``2 * cp_size``, so every rank gets the same share of causal work; else the
    contiguous slice ``i`` of ``N``.

    Example:
        >>> load_balanced_positions(6, cp_size=2, cp_rank=1).tolist()   # 6 % 4 != 0: no balancing
        [3, 4, 5]
    """
    if seq_len % cp_size:
        raise ConfigError(f"a sequence of {seq_len} tokens cannot be split evenly over cp_size={cp_size} processes; "
                          f"pad the sequences to a multiple of {2 * cp_size} (which also balances causal work).")
    if seq_len % (2 * cp_size) == 0:
        chunk = seq_len // (2 * cp_size)
        tail = 2 * cp_size - 1 - cp_rank
        return torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                          torch.arange(tail * chunk, (tail + 1) * chunk)])
    chunk = seq_len // cp_size
    return torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)


def _check_buffers(buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], no_restore: Any) -> None:
    if len(buffers) != len(seq_dims):
        raise ConfigError(f"maybe_context_parallel got {len(buffers)} buffers but {len(seq_dims)} buffer_seq_dims; "
                          "give one sequence dim per buffer.")
    for buffer in no_restore:  # identity, not ==: tensors compare elementwise
        if not any(buffer is b for b in buffers):
            raise ConfigError("no_restore_buffers holds a tensor that is not in buffers; it must be a subset of buffers.")
    lengths = {b.shape[d] for b, d in zip(buffers, seq_dims)}
    if len(lengths) > 1:
        raise ConfigError(f"the buffers have different sequence lengths {sorted(lengths)} along buffer_seq_dims; "
                          "give every buffer's sequence dim, with the same length.")


def shard_buffers(buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], cp_size: int, cp_rank: int,
                  no_restore: Any = ()) -> list[torch.Tensor | None]:
    """Replace, in place, each buffer by this rank's load-balanced slice; return the originals to restore (None: keep).

    Example:
        >>> ids = torch.arange(8).view(1, 8)
        >>> kept = shard_buffers([ids], [1], cp_size=2, cp_rank=1)
        >>> ids.tolist(), kept[0].tolist()
        ([[2, 3, 4, 5]], [[0, 1, 2, 3, 4, 5, 6, 7]])
    """
    _check_buffers(buffers, seq_dims, no_restore)
    originals: list[torch.Tensor | None] = []
    for buffer, dim in zip(buffers, seq_dims):
        positions = load_balanced_positions(buffer.shape[dim], cp_size, cp_rank).to(buffer.device)
        shard = buffer.index_select(dim, positions)
        originals.append(None if any(buffer is b for b in no_restore) else buffer.clone())
        buffer.resize_(shard.shape)  # in place, as torch's: the caller's tensor (a batch entry) now holds the shard
        buffer.copy_(shard)
    return originals


def restore_buffers(buffers: Sequence[torch.Tensor], originals: Sequence[torch.Tensor | None]) -> None:
    """Put back, in place, every buffer `shard_buffers` kept (the ones not in `no_restore_buffers`).

    Example:
        >>> ids = torch.arange(4).view(1, 4)
        >>> restore_buffers([ids], shard_buffers([ids], [1], cp_size=2, cp_rank=0))
        >>> ids.tolist()
        [[0, 1, 2, 3]]
    """
    for buffer, original in zip(buffers, originals):
        if original is not None:
            buffer.resize_(original.shape)
            buffer.copy_(original)


class _GatherSequence(torch.autograd.Function):
    """All-gather along `dim`; backward sums every rank's gradient of the whole and keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim, ctx.length = group, dim, local.shape[dim]
        parts = [torch.empty_like(local, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # every rank's queries read this rank's keys (all_reduce: gloo has no reduce_scatter)
        rank = dist.get_rank(ctx.group)
        return grad.narrow(ctx.dim, rank * ctx.length, ctx.length), None, None


def gathered_kv_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                          dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                          enable_gqa: bool = False, *, group: Any, cp_rank: int, cp_size: int,
                          sdpa: Callable[..., torch.Tensor] = F.scaled_dot_product_attention) -> torch.Tensor:
    """SDPA for a rank that holds a load-balanced slice of the sequence: local queries against all-gathered keys/values.

    The causal mask compares true positions (the slices are not contiguous
    under head-tail balancing), so the result equals rows of the 1-process
    attention, and gradients flow back to the ranks that own each key.

    Example:
        >>> # inside a 2-process group, with this rank's slices q, k, v of shape (batch, heads, seq/2, dim):
        >>> # out = gathered_kv_attention(q, k, v, is_causal=True, group=None, cp_rank=rank, cp_size=2)
    """
    if attn_mask is not None:
        raise ConfigError("scaled_dot_product_attention got an attn_mask inside maybe_context_parallel, which (as torch's "
                          "ring attention) supports only is_causal; drop the mask and pass is_causal=True.")
    local = query.shape[-2]
    if key.shape[-2] != local:
        raise ConfigError(f"inside maybe_context_parallel the query holds {local} tokens but the key {key.shape[-2]}; "
                          "shard every sequence the attention reads by passing it in buffers.")
    full_key = _GatherSequence.apply(key, group, key.dim() - 2)
    full_value = _GatherSequence.apply(value, group, value.dim() - 2)
    mask = None
    if is_causal:
        seq_len = local * cp_size
        mine = load_balanced_positions(seq_len, cp_size, cp_rank).to(query.device)
        every = torch.cat([load_balanced_positions(seq_len, cp_size, r) for r in range(cp_size)]).to(query.device)
        mask = every.unsqueeze(0) <= mine.unsqueeze(1)  # (local queries, all keys): a key no later than the query
    extra = {"enable_gqa": True} if enable_gqa else {}
    return sdpa(query, full_key, full_value, attn_mask=mask, dropout_p=dropout_p, is_causal=False, scale=scale, **extra)


@contextlib.contextmanager
def gathered_kv_context_parallel(mesh: DeviceMesh, *, buffers: list[torch.Tensor] | None = None,
                                 buffer_seq_dims: list[int] | None = None,
                                 no_restore_buffers: set[torch.Tensor] | None = None) -> Iterator[None]:
    """torch's ``context_parallel`` for CPU: shard the buffers, run SDPA as :func:`gathered_kv_attention`, restore.

    Example:
        >>> # in each process of a 2-process gloo group, with cp_mesh = accelerator.torch_device_mesh["cp"]:
        >>> # with gathered_kv_context_parallel(cp_mesh, buffers=[ids, labels], buffer_seq_dims=[1, 1]):
        >>> #     loss = model(ids, labels)
    """
    buffers, seq_dims = list(buffers or []), list(buffer_seq_dims or [])
    no_restore = list(no_restore_buffers or ())
    cp_size, cp_rank = mesh.size(), mesh.get_local_rank()
    originals = shard_buffers(buffers, seq_dims, cp_size, cp_rank, no_restore)
    original_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = functools.partial(  # type: ignore[assignment]  # what torch's CP patches too
        gathered_kv_attention, group=mesh.get_group(), cp_rank=cp_rank, cp_size=cp_size, sdpa=original_sdpa)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original_sdpa  # type: ignore[assignment]
        restore_buffers(buffers, originals)


def context_parallel_context(mesh: DeviceMesh, cp_handler: TorchContextParallelConfig | None) -> Callable[..., Any]:
    """The context manager factory `maybe_context_parallel` calls with the buffers: torch's on CUDA, the gathered-KV one on CPU.

    Example:
        >>> # cp = context_parallel_context(config.submesh("cp"), config.cp_handler)
        >>> # with cp(buffers=[ids], buffer_seq_dims=[1], no_restore_buffers=None): ...
    """
    if mesh.device_type == "cpu":
        return functools.partial(gathered_kv_context_parallel, mesh)
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method((cp_handler or TorchContextParallelConfig()).cp_comm_strategy or "allgather")
    return functools.partial(context_parallel, mesh)


def drop_attention_masks(model: torch.nn.Module) -> None:
    """As Accelerate: every ``*self_attn`` module gets ``attention_mask=None, is_causal=True`` (CP has no masks).

    Models whose layers use a stricter mask (sliding-window, chunked) are
    refused, since dropping it would silently train them with full causal
    attention (transformers' `supports_context_parallel` decides where the
    model has it, as in Accelerate 1.16; hasten reads the layer types where it
    has not); so are transformers models set to an attention other than
    SDPA, which would attend over this process's tokens only.

    Example:
        >>> drop_attention_masks(torch.nn.Linear(2, 2))   # no self_attn module: nothing to do
    """
    config: Any = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    supported = getattr(model, "supports_context_parallel", None)  # transformers says so (Accelerate 1.16 asks it)
    if supported is False:
        raise ConfigError(f"{type(model).__name__} does not support context parallelism, which can only run full "
                          "causal attention (a sliding-window or chunked layer would silently train as full causal, a "
                          "recurrent one never exchanges its state); use a full-attention model or cp_size=1.")
    layer_types = getattr(config, "layer_types", None)
    if supported is not None:  # transformers has judged the layers
        stricter: set[str] = set()
    elif layer_types is not None:
        stricter = {t for t in layer_types if t != "full_attention"}
    else:
        stricter = {"sliding_attention"} if getattr(config, "sliding_window", None) else set()
    if stricter:
        raise ConfigError(f"context parallelism can only run full causal attention, but {type(model).__name__} has "
                          f"{sorted(stricter)} layers; use a full-attention model or cp_size=1.")
    implementation = getattr(config, "_attn_implementation", None)
    if isinstance(implementation, str) and implementation != "sdpa":  # other kernels would see only local tokens
        raise ConfigError(f"context parallelism works through scaled_dot_product_attention, but {type(model).__name__} "
                          f"uses attn_implementation={implementation!r}; load it with attn_implementation='sdpa'.")

    def causal(_module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = None
            kwargs["is_causal"] = True
        return args, kwargs

    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            module.register_forward_pre_hook(causal, with_kwargs=True, prepend=True)
