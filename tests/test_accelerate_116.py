"""What a script observes of Accelerate 1.16 where 1.15 behaved otherwise (docs/coming-from-accelerate.md,
"Accelerate 1.16: what changed for a hasten user"), checked one process at a time.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from types import SimpleNamespace

import pytest
import torch

from hasten.checkpointing.rng import capture_rng_state, restore_rng_state
from hasten.core import accelerators
from hasten.runtime.collectives import split_for_process
from hasten.strategies.base import clip_by_total_norm


class _FakeDevice:
    """An accelerator module as torch's own (`torch.xpu`, ...) answers, without the hardware."""

    def __init__(self) -> None:
        self.state = torch.tensor([1, 2, 3], dtype=torch.uint8)
        self.restored: object = None

    def get_rng_state_all(self):
        return [self.state]

    def set_rng_state_all(self, states):
        self.restored = states

    def device_count(self) -> int:
        return 2


def test_device_discovery_names_the_accelerator_torch_reports(monkeypatch):
    from hasten.utils import get_distributed_backend, get_grad_scaler, get_torch_accelerator_backend, normalize_device

    if torch.accelerator.current_accelerator() is None:
        assert get_torch_accelerator_backend() == (None, None)
        assert get_grad_scaler()._device == "cpu"  # GradScaler("cpu") without an accelerator
    fake = _FakeDevice()
    monkeypatch.setattr(accelerators, "get_torch_accelerator_backend", lambda check_available=True: ("xpu", fake))
    assert normalize_device(3) == "xpu:3" and normalize_device("npu") == "npu:0" and normalize_device("cpu") == "cpu"
    assert get_distributed_backend("cuda") == "nccl" and get_distributed_backend("mps") is None


def test_rng_states_are_kept_per_device_type_and_a_missing_one_is_skipped(monkeypatch):
    fake = _FakeDevice()
    monkeypatch.setattr(accelerators, "get_torch_accelerator_backend", lambda check_available=True: ("xpu", fake))
    state = capture_rng_state()
    assert torch.equal(state["torch_xpu_manual_seed"][0], fake.state) and "torch_cuda_manual_seed" not in state
    restore_rng_state(state)
    assert fake.restored is state["torch_xpu_manual_seed"]
    fake.restored = None
    restore_rng_state({k: v for k, v in state.items() if k != "torch_xpu_manual_seed"})  # a CPU checkpoint
    assert fake.restored is None


def test_synchronize_rng_state_needs_its_type_and_the_device():
    from hasten.utils import RNGType, synchronize_rng_state, synchronize_rng_states

    assert "default" not in str(inspect.signature(synchronize_rng_state).parameters["rng_type"])
    synchronize_rng_state(RNGType.TORCH)
    synchronize_rng_states(["torch", "generator"], generator=torch.Generator())
    if torch.accelerator.current_accelerator() is None:
        with pytest.raises(AssertionError, match="Can't synchronize CUDA seeds without that device"):
            synchronize_rng_state("cuda")
    with pytest.raises(ValueError, match="pass generator="):
        synchronize_rng_state("generator")


def test_clipping_counts_with_norm_0_and_only_measures_with_an_infinite_max_norm():
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(3)]
    for param, grad in zip(params, ([1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0])):
        param.grad = torch.tensor(grad)
    assert clip_by_total_norm(params, 4.0, norm_type=0).item() == 2  # gradients that are not all zero
    params[0].grad = torch.tensor([float("inf"), 0.0, 0.0])
    assert clip_by_total_norm(params, float("inf")).item() == float("inf")
    assert params[2].grad.tolist() == [0.0, 2.0, 0.0]  # measured, not scaled (1.15 turned them into NaN)


def test_split_between_processes_pads_with_the_inputs_last_element():
    assert split_for_process([0, 1, 2, 3, 4, 5, 6], 1, 3, apply_padding=True) == [3, 4, 6]
    assert split_for_process((0, 1, 2), 1, 2, apply_padding=True) == (2, 2)
    assert split_for_process(torch.arange(7), 1, 3, apply_padding=True).tolist() == [3, 4, 6]


def test_notebook_launcher_takes_accelerates_order_and_refuses_an_unknown_precision():
    from hasten import notebook_launcher

    names = list(inspect.signature(notebook_launcher).parameters)
    assert names[names.index("num_nodes"):] == ["num_nodes", "rdzv_backend", "rdzv_endpoint", "rdzv_conf", "rdzv_id",
                                                "max_restarts", "monitor_interval", "log_line_prefix_template"]
    with pytest.raises(ValueError, match="Unknown mixed_precision mode: 'bogus'"):
        notebook_launcher(lambda: None, num_processes=1, mixed_precision="bogus")
    seen = []
    notebook_launcher(lambda: seen.append(__import__("os").environ.get("HASTEN_LAUNCH_SPEC")), num_processes=1,
                      mixed_precision="BF16")
    assert '"mixed_precision": "bf16"' in seen[0]


def test_the_library_verbosity_reaches_accelerates_and_hastens_loggers():
    from hasten.logging import get_verbosity, set_verbosity, set_verbosity_error

    try:
        set_verbosity_error()
        assert logging.getLogger("accelerate").level == logging.getLogger("hasten").level == logging.ERROR
        assert logging.getLogger("hasten.cli").getEffectiveLevel() == logging.ERROR == get_verbosity()
        set_verbosity("debug")
        assert get_verbosity() == logging.DEBUG and logging.getLogger().level != logging.DEBUG  # root untouched
        with pytest.raises(ValueError, match="not a logging level"):
            set_verbosity("loud")
    finally:
        set_verbosity(logging.NOTSET)


def test_optimizers_follow_parameters_that_placing_replaced():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = accelerator._get_named_parameters(model)
    model.weight = torch.nn.Parameter(model.weight.detach().clone())  # what an overwriting `.to()` does
    accelerator._remap_optimizer_parameters(before, model, optimizer)
    assert optimizer.param_groups[0]["params"][0] is model.weight
    assert accelerator._get_named_parameters(model, drop_refs=True) == {"weight": model.weight.data_ptr()}


def test_the_recurrent_refusal_and_its_opt_out(monkeypatch):
    from hasten.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism as refuse
    from hasten.utils import DeepSpeedSequenceParallelConfig

    model = SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention", "linear_attention"]))
    with pytest.raises(ValueError, match="sp_allow_recurrent_layers=True"):
        refuse(model)
    handler = DeepSpeedSequenceParallelConfig()
    assert (handler.sp_allow_recurrent_layers, handler.sp_disable_in_eval) == (False, True)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL", "false")
    assert DeepSpeedSequenceParallelConfig().sp_disable_in_eval is False


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="Accelerate 1.16 is the reference here")
def test_names_16_removed_are_gone_from_accelerates_paths():
    import hasten
    import hasten.utils

    for name in ("FP8RecipeKwargs", "MSAMPRecipeKwargs", "is_weights_only_available", "is_pippy_available",
                 "is_msamp_available", "FSDP2_PYTORCH_VERSION"):
        assert not hasattr(hasten.utils, name), name
    assert "prepare_pippy" not in hasten.__all__ and importlib.util.find_spec("hasten.inference") is None
    from hasten.strategies.parallel import prepare_pippy  # hasten's own path keeps pipelined inference

    assert callable(prepare_pippy)
