"""Mixed precision policies: "no", "fp16" (autocast + GradScaler), "bf16" and "fp8" (bf16 autocast).

The policy is chosen once from (precision, device). As in Accelerate, the
model's forward is wrapped at `prepare` time in autocast, and its fp16/bf16
outputs are cast back to fp32 (so a loss computed outside the model is
computed in fp32).

fp16 on the CPU: Accelerate trains such a run in full precision (no autocast,
no scaler) while `mixed_precision` still reads "fp16"; hasten does the same,
and says so once. ``HASTEN_CPU_FP16=1`` opts in to real fp16 autocast with a
CPU GradScaler (slow; meant for testing fp16 code paths without a GPU).
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..process.launch_spec import MIXED_PRECISION_CHOICES, cpu_fp16_enabled, fp8_problem
from .nesting import recursively_apply

__all__ = ["PrecisionPolicy", "make_precision_policy", "check_precision_supported", "convert_to_fp32",
           "ConvertOutputsToFp32", "convert_outputs_to_fp32"]

# fp8 runs its forward under bf16 autocast as in Accelerate; the fp8 matrix products are `hasten.fp8`'s Float8Linear.
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def _is_half(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def convert_to_fp32(outputs: Any) -> Any:
    """`outputs` with every fp16/bf16 tensor (in lists, tuples, dicts, model outputs) cast to fp32.

    Example:
        >>> convert_to_fp32({"logits": torch.ones(1, dtype=torch.bfloat16), "n": 1})["logits"].dtype
        torch.float32
    """
    if isinstance(outputs, torch.Tensor):  # the common case, on every step: no tree walk
        return outputs.float() if outputs.dtype in (torch.float16, torch.bfloat16) else outputs
    return recursively_apply(_to_float, outputs, test_type=_is_half)


def _to_float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float()


class ConvertOutputsToFp32:
    """A forward whose fp16/bf16 outputs come back as fp32 (Accelerate's class of that name); it refuses pickling.

    Its ``__wrapped__`` is the forward it calls, so unwrapping and `inspect.signature` reach it.

    Example:
        >>> half = ConvertOutputsToFp32(lambda x: x.half())
        >>> half(torch.ones(1)).dtype
        torch.float32
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError("Cannot pickle a model whose forward casts its outputs to fp32 (a prepared model "
                                   "under mixed precision); pickle accelerator.unwrap_model(model) instead.")


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """`model_forward` wrapped so that its fp16/bf16 outputs (nested too) are cast to fp32.

    The result is a plain function (it binds like a method) whose ``__wrapped__`` is a `ConvertOutputsToFp32`,
    so `extract_model_from_parallel(model, keep_fp32_wrapper=False)` can take it off again when the model keeps
    its original forward as ``model._original_forward``, as Accelerate's `prepare` does.

    Example:
        >>> forward = convert_outputs_to_fp32(lambda x: x.to(torch.bfloat16))
        >>> forward(torch.ones(2)).dtype
        torch.float32
    """
    wrapper = ConvertOutputsToFp32(model_forward)

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapper(*args, **kwargs)

    forward.__wrapped__ = wrapper  # type: ignore[attr-defined]  # the chain unwrapping walks
    return forward


def check_precision_supported(precision: str, device_type: str, bf16_supported: bool | None = None) -> None:
    """Raise one clear error if `precision` is unknown or impossible on `device_type`.

    Example:
        >>> check_precision_supported("bf16", "cpu")
        >>> check_precision_supported("fp32", "cpu")
        Traceback (most recent call last):
        ...
        ValueError: mixed_precision='fp32' is not one of 'no', 'fp16', 'bf16', 'fp8'; pick one of those.
    """
    if precision not in MIXED_PRECISION_CHOICES:
        choices = ", ".join(repr(c) for c in MIXED_PRECISION_CHOICES)
        raise ValueError(f"mixed_precision={precision!r} is not one of {choices}; pick one of those.")
    if precision == "fp8" and (problem := fp8_problem()):
        raise ValueError(problem)
    if precision == "bf16" and device_type == "cuda":
        if bf16_supported is None:
            bf16_supported = torch.cuda.is_bf16_supported()
        if not bf16_supported:
            raise ValueError(
                "mixed_precision='bf16' needs a GPU with bfloat16 support (Ampere or newer); "
                "use mixed_precision='fp16' on this GPU."
            )
    if precision != "no" and not torch.amp.is_autocast_available(device_type):
        raise ValueError(f"mixed_precision={precision!r} is not available on device type {device_type!r}; use 'no'.")


@dataclass
class PrecisionPolicy:
    """How forward passes are cast and how losses are scaled.

    Example:
        >>> policy = make_precision_policy("bf16", torch.device("cpu"))
        >>> with policy.autocast():
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.bfloat16
    """

    name: str
    device_type: str
    dtype: torch.dtype | None
    scaler: "torch.amp.GradScaler | None" = None

    def autocast(self, enabled: bool = True, cache_enabled: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """This policy's autocast block (nothing under full precision or when not `enabled`)."""
        if self.dtype is None or not enabled:
            return contextlib.nullcontext()
        extra = {} if cache_enabled is None else {"cache_enabled": cache_enabled}
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, **extra)

    def wrap_forward(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """The same forward, run under this policy's autocast."""
        if self.dtype is None:
            return forward
        device_type, dtype = self.device_type, self.dtype

        @functools.wraps(forward)
        def autocast_forward(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type=device_type, dtype=dtype):
                outputs = forward(*args, **kwargs)
            return convert_to_fp32(outputs)

        autocast_forward.__wrapped_forward__ = forward  # type: ignore[attr-defined]
        return autocast_forward

    def step(self, optimizer: Any, closure: Callable[[], Any] | None = None) -> tuple[Any, bool]:
        """Step `optimizer`; under fp16 through the scaler. Returns (result, whether the step was skipped)."""
        scaler = self.scaler
        if scaler is None:
            return (optimizer.step(closure) if closure is not None else optimizer.step()), False
        # The scaler skips the step when the unscaled gradients hold inf/NaN. Its own check reads that flag
        # to the host after unscaling, before the optimizer's kernels are queued; reading it here at that same
        # point costs no sync of its own. (Comparing scales before and after, Accelerate's way, syncs twice
        # more and the second one waits for the optimizer step: 14% of a step on an H200.)
        skipped = False
        if scaler.is_enabled():
            from torch.amp.grad_scaler import OptState

            state = scaler._per_optimizer_states[id(optimizer)]
            if state["stage"] is OptState.READY:
                scaler.unscale_(optimizer)
            skipped = sum(v.item() for v in state["found_inf_per_device"].values()) > 0
        result = scaler.step(optimizer, closure) if closure is not None else scaler.step(optimizer)
        scaler.update()
        return result, skipped

    def unscale(self, optimizer: Any) -> None:
        """Divide `optimizer`'s gradients by the loss scale, once per step (a no-op without fp16)."""
        scaler = self.scaler
        if scaler is None:
            return
        from torch.amp.grad_scaler import OptState

        inner = getattr(optimizer, "optimizer", optimizer)
        if scaler._per_optimizer_states[id(inner)]["stage"] is OptState.READY:
            scaler.unscale_(inner)


def make_precision_policy(precision: str, device: torch.device, scaler_kwargs: dict[str, Any] | None = None,
                          scaler_class: Callable[..., Any] | None = None) -> PrecisionPolicy:
    """Build the policy for `precision` on `device`, validating it first.

    `scaler_class` lets a sharded strategy use a scaler that agrees on
    inf/NaN across processes (FSDP's `ShardedGradScaler`).

    Example:
        >>> make_precision_policy("bf16", torch.device("cpu")).dtype
        torch.bfloat16
    """
    check_precision_supported(precision, device.type)
    if precision == "fp16" and device.type == "cpu" and not cpu_fp16_enabled():
        warnings.warn("mixed_precision='fp16' needs a GPU: on the CPU this run trains in full precision, as under "
                      "Accelerate (use 'bf16' for mixed precision on the CPU).", stacklevel=3)
        return PrecisionPolicy(name=precision, device_type=device.type, dtype=None, scaler=None)
    dtype = _DTYPES.get(precision)
    scaler = None
    if precision == "fp16":
        scaler = (scaler_class or torch.amp.GradScaler)(device.type, **(scaler_kwargs or {}))
    return PrecisionPolicy(name=precision, device_type=device.type, dtype=dtype, scaler=scaler)
