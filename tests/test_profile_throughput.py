"""accelerator.profile() writes a Chrome trace per process; the throughput meter's arithmetic."""

import json

import pytest
import torch

from hasten import Accelerator, ProfileKwargs, ThroughputMeter
from hasten.utils import count_flops_per_sample


def test_profile_writes_a_chrome_trace(tmp_path):
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(record_shapes=True, output_trace_dir=str(tmp_path))])
    model = torch.nn.Linear(16, 16)
    with accelerator.profile() as profiler:
        model(torch.randn(4, 16)).sum().backward()
    trace = json.loads((tmp_path / "profile_0.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "aten::addmm" in names or "aten::linear" in names
    assert profiler.key_averages()  # the profiler object is the torch one


def test_profile_refuses_unknown_activities():
    with pytest.raises(ValueError, match=r"ProfileKwargs\(activities=...\) got \['gpu'\]"):
        ProfileKwargs(activities=["gpu"]).build()


def test_throughput_meter_rates(monkeypatch):
    clock = iter([10.0, 10.5, 11.0, 11.5])
    monkeypatch.setattr("hasten.runtime.throughput.time.perf_counter", lambda: next(clock))
    meter = ThroughputMeter(window=3, flops_per_sample=100.0, peak_flops=1000.0, world_size=2)
    assert meter.compute() == {}
    for _ in range(4):
        meter.step(samples=10, tokens=40)
    # 3 steps of 10 samples on 2 processes in 1.5 s
    assert meter.compute() == pytest.approx({"samples_per_sec": 40.0, "tokens_per_sec": 160.0,
                                             "flops_per_sec": 4000.0, "mfu": 2.0})


def test_flops_are_counted_by_torch():
    assert count_flops_per_sample(torch.nn.Linear(10, 5, bias=False), torch.ones(4, 10)) == 2 * 10 * 5 * 3
