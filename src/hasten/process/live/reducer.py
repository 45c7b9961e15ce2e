"""The step's one cross-machine collective in a live run: the gradients, flat, in a fixed parameter order.

torch's DistributedDataParallel is not used across machines in a live run: its buckets are built for one fixed group
and a peer lost inside its all-reduce leaves the reducer unusable (torchft's wrapper of it asserts then). Instead, at
the step's synchronising micro-batch, `LiveReducer.reduce` lays every gradient (a missing one as zeros) into one flat
tensor in parameter order (the same layout on every machine, survivor or joiner), averages it over the quorum, and
copies the result back. A failure is recorded by the group and reported as False, never raised: the step then does
not commit and is dealt again.

Example:
    >>> import torch
    >>> class Doubling:                        # a stand-in group of two identical machines
    ...     def allreduce(self, flat):
    ...         return True                    # (the average of two equal tensors is the tensor)
    >>> param = torch.nn.Parameter(torch.ones(2)); param.grad = torch.full((2,), 3.0)
    >>> LiveReducer([param], Doubling()).reduce(), param.grad.tolist()
    (True, [3.0, 3.0])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["LiveReducer", "ReducingGroup"]


class ReducingGroup(Protocol):
    """What the reducer needs of the live group (`LiveGroup`): average `flat` in place over the step's quorum; False
    when it failed (the tensor is then garbage)."""

    def allreduce(self, flat: torch.Tensor) -> bool: ...


class LiveReducer:
    """Averages the gradients of `params` (those that require a gradient, in the given order) over `group`.

    Example:
        >>> import torch
        >>> class Failing:
        ...     def allreduce(self, flat): flat.fill_(float("nan")); return False
        >>> param = torch.nn.Parameter(torch.ones(1)); param.grad = torch.ones(1)
        >>> reducer = LiveReducer([param], Failing())
        >>> reducer.reduce(), reducer.failed
        (False, True)
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], group: ReducingGroup) -> None:
        seen: set[int] = set()
        self.params = [p for p in params if p.requires_grad and not (id(p) in seen or seen.add(id(p)))]  # type: ignore[func-returns-value]
        self.group = group
        self.failed = False  # the last reduce failed (the step must not commit)

    def reduce(self) -> bool:
        """Average every gradient over the group; True when it succeeded everywhere this process can tell."""
        import torch

        if not self.params:
            self.failed = not self.group.allreduce(torch.zeros(0))
            return not self.failed
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            # a sharded gradient (FSDP2 within the machine: a DTensor) is averaged as this process's shard, with the
            # same shard of every other machine (HSDP: sharded in the machine, replicated across machines)
            grads.append(getattr(p.grad, "_local_tensor", p.grad))
        flat = torch.cat([g.reshape(-1) for g in grads])
        ok = self.group.allreduce(flat)
        offset = 0
        with torch.no_grad():
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self.failed = not ok
        return ok
