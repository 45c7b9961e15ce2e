"""The Accelerator on one process: API misuse, accumulation, precision, saving."""

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, PartialState, set_seed
from hasten.options import DistributedDataParallelKwargs, GradScalerKwargs


def make_run(acc, n=32, batch=4, lr=0.1):
    set_seed(0)
    x = torch.randn(n, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    return acc.prepare(model, optimizer, loader)


def test_backward_before_prepare_is_one_clear_error():
    acc = Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match=r"backward was called before accelerator.prepare"):
        acc.backward(torch.ones(1, requires_grad=True).sum())


def test_preparing_the_same_object_twice_is_refused():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="same object twice"):
        acc.prepare(model, model)


def test_a_prepared_object_passed_again_comes_back_unchanged_as_in_accelerate():
    # Accelerate marks what prepare returns (`_is_accelerate_prepared`) and returns it as it is when it comes back
    # (transformers' Trainer prepares again on each try of its batch-size search); nothing is wrapped twice.
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(list(range(4)), batch_size=2)
    prepared = acc.prepare(model, optimizer, scheduler, loader)
    assert all(getattr(p, "_is_accelerate_prepared", False) for p in prepared)
    again = acc.prepare(*prepared)
    assert all(a is p for a, p in zip(again, prepared))
    assert acc.prepare_model(prepared[0]) is prepared[0]
    assert (len(acc._models), len(acc._optimizers), len(acc._schedulers), len(acc._dataloaders)) == (1, 1, 1, 1)
    acc._models.clear()
    assert acc.prepare(prepared[0]) is prepared[0] and acc._models == [prepared[0]]  # put back, as Accelerate does


def test_an_object_hasten_wrapped_is_refused_when_passed_again():
    # The torch optimizer behind an AcceleratedOptimizer (or a module behind DDP): wrapping it again would step
    # (or synchronise) it twice, so hasten names the object to use instead.
    acc = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    acc.prepare(optimizer)
    with pytest.raises(ValueError, match="keep using the object prepare returned"):
        acc.prepare(optimizer)


def test_prepare_returns_in_order_and_passes_other_objects_through():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(list(range(4)), batch_size=2)
    out = acc.prepare(scheduler, loader, "keep", optimizer, model)
    assert [type(o).__name__ for o in out] == ["AcceleratedScheduler", "PreparedDataLoader", "str", "AcceleratedOptimizer", "Linear"]
    assert out[0].optimizers == [out[3]]  # the scheduler knows its optimizer whatever the order


@pytest.mark.parametrize("bad", ["fp32", "bf32", "yes"])
def test_unknown_precision(bad):
    with pytest.raises(ValueError, match=rf"mixed_precision='{bad}' is not one of 'no', 'fp16', 'bf16', 'fp8'"):
        Accelerator(cpu=True, mixed_precision=bad)


def test_unsupported_and_unknown_arguments():
    with pytest.raises(TypeError, match="must be a hasten DeepSpeedPlugin"):
        Accelerator(cpu=True, deepspeed_plugin=object())
    with pytest.raises(TypeError, match="must be a hasten FullyShardedDataParallelPlugin"):
        Accelerator(cpu=True, fsdp_plugin=object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'mixed_precison'"):
        Accelerator(cpu=True, mixed_precison="bf16")
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1"):
        Accelerator(cpu=True, gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="two DistributedDataParallelKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()])


def test_every_part_of_the_facade_gets_the_shared_values_it_declares():
    # mypy checks the types of what each part declares; this checks that the Accelerator sets every one.
    from hasten.facade import checkpoints, preparing, processes, runtime, trackers

    parts = [processes.ProcessPart, preparing.PreparePart, checkpoints.CheckpointPart, trackers.TrackerPart,
             runtime.RuntimePart]
    accelerator = Accelerator(cpu=True)
    assert all(issubclass(Accelerator, part) for part in parts)
    assert [f"{part.__name__}.{name}" for part in parts for name in part.__annotations__
            if not hasattr(accelerator, name)] == []


def test_two_accelerators_keep_their_precision_and_share_the_gradient_state():
    a = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    assert (a.mixed_precision, a.gradient_accumulation_steps) == ("bf16", 2)
    b = Accelerator(cpu=True)
    assert (a.mixed_precision, b.mixed_precision) == ("bf16", "no")
    # As in Accelerate, the gradient state is one per process: the newest Accelerator's settings hold.
    assert a.gradient_state is b.gradient_state or a.gradient_state.__dict__ is b.gradient_state.__dict__
    assert a.gradient_accumulation_steps == b.gradient_accumulation_steps == 1


def test_fp16_on_the_cpu_trains_in_full_precision_as_accelerate_does(monkeypatch):
    monkeypatch.delenv("HASTEN_CPU_FP16", raising=False)
    with pytest.warns(UserWarning, match="needs a GPU: on the CPU this run trains in full precision"):
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    assert accelerator.mixed_precision == "fp16" and accelerator.scaler is None
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert model(torch.ones(1, 2)).dtype == torch.float32


def test_accumulation_equals_one_big_batch():
    # 4 micro-batches of 4 with accumulation 4 == batches of 16.
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer, loader = make_run(acc, batch=4)
    syncs = []
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            syncs.append(acc.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    assert syncs == [False, False, False, True] * 2

    big = Accelerator(cpu=True)
    ref, ref_opt, ref_loader = make_run(big, batch=16)
    for x, y in ref_loader:
        big.backward(torch.nn.functional.mse_loss(ref(x), y))
        ref_opt.step()
        ref_opt.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    assert not torch.allclose(ref.weight, torch.nn.Linear(3, 1).weight)


def test_last_batch_of_loader_forces_a_sync():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer, loader = make_run(acc, n=24, batch=4)  # 6 batches
    syncs = []
    for x, y in loader:
        with acc.accumulate(model):
            syncs.append(acc.sync_gradients)
    assert syncs == [False, False, False, True, False, True]


def test_scheduler_steps_once_per_optimizer_step():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, scheduler, loader = acc.prepare(model, optimizer, scheduler, DataLoader(torch.randn(16, 2), batch_size=2))
    for x in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.scheduler.last_epoch == 4  # 8 micro-batches / 2


def test_clip_grad_norm_clips_whenever_called_as_accelerate_does():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, loader = make_run(acc, n=8, batch=4)
    norms = []
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y) * 100)
            norms.append(acc.clip_grad_norm_(model.parameters(), 0.5))
            total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
            assert total == pytest.approx(0.5, rel=1e-4)  # the partial gradient of a non-sync step is clipped too
    assert all(norm is not None and norm > 0.5 for norm in norms)


def test_bf16_forward_is_autocast_and_outputs_come_back_in_fp32():
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = acc.prepare(torch.nn.Linear(4, 4))
    out = model(torch.randn(2, 4))
    assert out.dtype == torch.float32  # Accelerate's convert_outputs_to_fp32
    assert model.weight.dtype == torch.float32  # master weights stay fp32
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.randn(2, 4)).dtype == torch.float32
    assert "forward" not in vars(plain)
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_bf16_autocasts_a_forward_a_library_set_on_the_instance():
    # TRL's SFTTrainer puts its fused-loss forward on the model instance before Trainer prepares it.
    model = torch.nn.Linear(4, 4)
    seen = []

    def fused_forward(self, x):
        seen.append(torch.is_autocast_enabled("cpu"))
        return torch.nn.Linear.forward(self, x)

    model.forward = fused_forward.__get__(model)
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    prepared = acc.prepare_model(model)
    assert prepared(torch.randn(2, 4)).dtype == torch.float32 and seen == [True]
    plain = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    plain(torch.randn(2, 4))
    assert seen == [True, False] and vars(plain)["forward"].__func__ is fused_forward


def test_fp16_skips_the_step_on_inf_and_the_scheduler_waits():
    acc = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0**8)])
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(1, 2)).float().sum() * float("inf")
    acc.backward(loss)
    optimizer.step()
    scheduler.step()
    assert acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scheduler.scheduler.last_epoch == 0
    optimizer.zero_grad()
    acc.backward(model(torch.ones(1, 2)).float().sum())
    optimizer.step()
    scheduler.step()
    assert not acc.optimizer_step_was_skipped and scheduler.scheduler.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_save_writes_the_format_accelerates_save_writes_and_leaves_no_partial_file(tmp_path):
    from safetensors.torch import load_file

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    state = acc.unwrap_model(model).state_dict()
    # As in Accelerate 1.16, safe_serialization defaults to False: torch.save's zip pickle, whatever the file's name.
    acc.save(state, tmp_path / "model.safetensors")
    assert (tmp_path / "model.safetensors").read_bytes()[:4] == b"PK\x03\x04"
    acc.save(state, tmp_path / "model.bin")
    assert torch.equal(torch.load(tmp_path / "model.bin", weights_only=True)["weight"], model.weight)
    acc.save(state, tmp_path / "safe.safetensors", safe_serialization=True)
    assert torch.equal(load_file(tmp_path / "safe.safetensors")["weight"], model.weight)
    with pytest.raises(ValueError, match="safetensors can only store a dict of str -> tensor"):
        acc.save({"step": 3}, tmp_path / "bad.safetensors", safe_serialization=True)
    assert sorted(os.listdir(tmp_path)) == ["model.bin", "model.safetensors", "safe.safetensors"]


def test_utils_save_keeps_accelerates_signature_and_stores_tied_weights_once(tmp_path):
    import inspect
    from collections import OrderedDict

    import accelerate.utils
    from safetensors.torch import load_file

    import hasten.utils

    assert list(inspect.signature(hasten.utils.save).parameters) == list(inspect.signature(accelerate.utils.save).parameters)
    from accelerate.state import AcceleratorState as PeerState

    weight = torch.randn(3, 3)
    try:
        for name, save in (("hasten", hasten.utils.save), ("accelerate", accelerate.utils.save)):
            save(OrderedDict(a=weight, b=weight, c=torch.zeros(1)), tmp_path / f"{name}.safetensors", False, True)
            save({"w": weight, "step": 3}, tmp_path / f"{name}.pt")  # the defaults: main process, a pickle
    finally:
        PeerState._reset_state(True)  # Accelerate's state singletons would leak into later tests
    ours, theirs = load_file(tmp_path / "hasten.safetensors"), load_file(tmp_path / "accelerate.safetensors")
    assert sorted(ours) == sorted(theirs) == ["a", "c"] and torch.equal(ours["a"], theirs["a"])
    ours, theirs = (torch.load(tmp_path / f"{name}.pt", weights_only=True) for name in ("hasten", "accelerate"))
    assert ours.keys() == theirs.keys() and torch.equal(ours["w"], theirs["w"]) and ours["step"] == theirs["step"] == 3


def test_tied_weights_save_with_safetensors(tmp_path):
    from hasten.core.saving import save

    weight = torch.randn(3, 3)
    save({"a": weight, "b": weight}, tmp_path / "tied.safetensors")
    from safetensors.torch import load_file

    loaded = load_file(tmp_path / "tied.safetensors")
    assert torch.equal(loaded["a"], loaded["b"])


def test_single_process_collectives_are_identity():
    acc = Accelerator(cpu=True)
    data = {"a": [torch.arange(3)], "b": torch.tensor(1.0)}
    assert acc.gather(data) is data
    assert acc.gather_for_metrics(torch.arange(5)).tolist() == list(range(5))
    assert acc.gather_object(["x"]) == ["x"]
    assert acc.reduce(torch.tensor([2.0]), "mean").tolist() == [2.0]
    with pytest.raises(ValueError, match="reduction='median' is not one of"):
        acc.reduce(torch.tensor([2.0]), "median")


def test_partial_state_without_accelerator():
    state = PartialState(cpu=True)
    calls = []

    @state.on_main_process
    def main_only():
        calls.append("main")

    @state.on_process(process_index=1)
    def second_only():
        calls.append("second")

    main_only()
    second_only()
    assert calls == ["main"]
    with state.split_between_processes([1, 2, 3], apply_padding=True) as share:
        assert share == [1, 2, 3]
    assert state.is_main_process and state.is_last_process and state.num_processes == 1


def test_set_seed_is_reproducible():
    set_seed(123)
    a = torch.rand(3)
    set_seed(123)
    assert torch.equal(a, torch.rand(3))


def test_free_memory_forgets_prepared_objects():
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    (model,) = acc.free_memory(model)
    assert model is None and acc._models == []


def test_fp16_clipping_on_a_non_sync_step_is_refused_in_one_sentence():
    acc = Accelerator(cpu=True, mixed_precision="fp16", gradient_accumulation_steps=2)  # (the suite's real CPU fp16)
    model, optimizer, loader = make_run(acc, n=8, batch=4)
    x, y = next(iter(loader))
    with acc.accumulate(model):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        with pytest.raises(RuntimeError, match=r"would unscale a partial gradient; call it under `if accelerator.sync"):
            acc.clip_grad_norm_(model.parameters(), 1.0)


def test_the_attributes_diffusers_and_accelerate_examples_read():
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    assert acc.native_amp and acc.ao_recipe_handler is None and acc.parallelism_config is None
    assert not hasattr(acc, "fp8_recipe_handler")  # Accelerate 1.16 removed it with FP8RecipeKwargs
    assert acc.torch_device_mesh is None  # no engine mesh without FSDP / a ParallelismConfig
    acc.native_amp = False  # what diffusers' examples do on Apple's MPS: autocast off from here on
    model = acc.prepare(torch.nn.Linear(2, 2))
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert "forward" not in vars(model)
    with acc.maybe_context_parallel(buffers=[torch.ones(1, 4)], buffer_seq_dims=[1]):
        pass  # no context parallelism configured: the block just runs, as under Accelerate


def test_test_utils_face_has_what_the_examples_import():
    from hasten.test_utils import torch_device
    from hasten.test_utils.training import MRPC_FILES, mocked_dataloaders, mocked_dataloaders_for_autoregressive_models

    assert torch_device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert MRPC_FILES["train"].endswith("MRPC/train.csv")
    assert callable(mocked_dataloaders) and callable(mocked_dataloaders_for_autoregressive_models)
