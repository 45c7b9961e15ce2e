"""Throughput of a training loop: samples/s, tokens/s, achieved FLOP/s and MFU, without a device sync.

`ThroughputMeter.step()` only reads a clock and appends to a short deque
(well under a microsecond), so calling it every step does not show in
the overhead benchmark. On GPUs the clock runs ahead of queued kernels;
over a window of steps the rate is right once the queue is full.

Example:
    >>> meter = ThroughputMeter(window=4, flops_per_sample=1e6, world_size=2)
    >>> for _ in range(5):
    ...     meter.step(samples=32)
    >>> sorted(meter.compute())
    ['flops_per_sec', 'samples_per_sec']
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

__all__ = ["ThroughputMeter", "count_flops_per_sample", "peak_flops"]

# dense bf16/fp16 tensor-core peaks, FLOP/s (vendor data sheets, without sparsity)
_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12,
              "V100": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12}


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """The dense half-precision peak of a known GPU (None for CPUs and unknown GPUs: pass your own to the meter)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in _PEAK_BF16.items() if key in name), None)


def count_flops_per_sample(model: torch.nn.Module, example_batch: Any, training: bool = True) -> float:
    """FLOPs per sample of one forward (x3 for forward + backward when `training`), counted by torch.

    `example_batch` is what the model is called with (a tensor, a tuple of
    arguments or a dict of keyword arguments); its first dimension is the batch.

    Example:
        >>> count_flops_per_sample(torch.nn.Linear(10, 5, bias=False), torch.ones(4, 10))
        300.0
    """
    from torch.utils.flop_counter import FlopCounterMode

    args: tuple[Any, ...]
    if isinstance(example_batch, dict):
        args, kwargs = (), example_batch
    elif isinstance(example_batch, (tuple, list)):
        args, kwargs = tuple(example_batch), {}
    else:
        args, kwargs = (example_batch,), {}
    first = next(t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*args, **kwargs)
    return counter.get_total_flops() / first.shape[0] * (3 if training else 1)


class ThroughputMeter:
    """Rates over the last `window` steps; global rates are per-process rates times `world_size`.

    Give `flops_per_sample` (e.g. from `count_flops_per_sample`) to get
    FLOP/s, and `peak_flops` (per device; see `peak_flops()`) to get MFU.
    """

    def __init__(self, window: int = 20, flops_per_sample: float | None = None, peak_flops: float | None = None,
                 world_size: int = 1) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.world_size = world_size
        self._times: deque[float] = deque(maxlen=window + 1)
        self._samples: deque[int] = deque(maxlen=window + 1)
        self._tokens: deque[int] = deque(maxlen=window + 1)

    def step(self, samples: int, tokens: int | None = None) -> None:
        """Record one finished step of `samples` samples (and `tokens` tokens) on this process."""
        self._times.append(time.perf_counter())
        self._samples.append(samples)
        self._tokens.append(tokens or 0)

    def compute(self) -> dict[str, float]:
        """``samples_per_sec`` (and ``tokens_per_sec``, ``flops_per_sec``, ``mfu`` when known), all processes together."""
        if len(self._times) < 2:
            return {}
        elapsed = self._times[-1] - self._times[0]
        if elapsed <= 0:
            return {}
        samples = sum(list(self._samples)[1:]) * self.world_size  # the first entry opens the window
        rates = {"samples_per_sec": samples / elapsed}
        tokens = sum(list(self._tokens)[1:]) * self.world_size
        if tokens:
            rates["tokens_per_sec"] = tokens / elapsed
        if self.flops_per_sample is not None:
            rates["flops_per_sec"] = rates["samples_per_sec"] * self.flops_per_sample
            if self.peak_flops:
                rates["mfu"] = rates["flops_per_sec"] / (self.peak_flops * self.world_size)
        return rates
