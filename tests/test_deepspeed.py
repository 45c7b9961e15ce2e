"""DeepSpeed ZeRO 1/2/3 on CPU: equivalence with a plain run, sharding, checkpoints, config checks, clear errors.

The multi-process checks share two launches (`runs` fixture): one trains every ZeRO configuration and an
uninterrupted run that saves a checkpoint midway, the other is a NEW launch that loads those checkpoints.
The first DeepSpeed run of a machine JIT-builds a CPU communication op (~45 s, cached in
~/.cache/torch_extensions), hence the generous timeout of the first launch.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from conftest import SCRIPTS, launch, run_with_timeout  # noqa: E402
from hasten import Accelerator  # noqa: E402
from hasten.state import AcceleratorState  # noqa: E402
from hasten.utils.deepspeed import DeepSpeedConfigError, DeepSpeedPlugin, DummyOptim, DummyScheduler  # noqa: E402

SCRIPT = "ds_train.py"
TOLERANCE = 1e-5
# 2-process ZeRO run name -> (stage, accumulation, 1-process plain run it must equal)
ZERO_RUNS = {"z1": ("1", "1", "a1"), "z2": ("2", "1", "a1"), "z3": ("3", "1", "a1"),
             "z2a3": ("2", "3", "a3"), "z3a3": ("3", "3", "a3"), "launch": ("launch", "1", "a1")}
CHECKPOINT_STAGES = ("2", "3")
SAVE_AT = 5  # micro-batches before the checkpoint (mid-epoch: 8 batches per epoch)


@pytest.fixture(autouse=True)
def _fresh_run_state():
    """A DeepSpeed Accelerator's plugin is shared by every later Accelerator of the process (as in Accelerate, whose
    test cases reset the state after each test): forget it after each test."""
    yield
    AcceleratorState._reset_state()


def _load(path):
    return {k: v.double() for k, v in load_file(str(path)).items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepspeed")
    plain, zero = root / "plain", root / "zero"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HASTEN_LAUNCH_SPEC")}
    command = [sys.executable, str(SCRIPTS / SCRIPT), "plain", str(plain), "a1:1", "a3:3"]
    result = run_with_timeout(command, 120, env)
    assert result.returncode == 0, result.stderr
    configs = [f"{name}:{stage}:{accum}" for name, (stage, accum, _) in ZERO_RUNS.items()]
    configs += [f"ckpt:{stage}:{SAVE_AT}" for stage in CHECKPOINT_STAGES]
    launch(SCRIPT, "zero", str(zero), *configs, num_processes=2, launch_args=("--use_deepspeed", "--zero_stage", "3"),
           timeout=300)  # includes the one-time JIT build of DeepSpeed's CPU op
    launch(SCRIPT, "resume", str(zero), *CHECKPOINT_STAGES, num_processes=2,
           launch_args=("--use_deepspeed", "--zero_stage", "3"), timeout=180)
    return plain, zero


def _info(directory, name, rank):
    return json.loads((directory / f"{name}.rank{rank}.json").read_text())


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(ZERO_RUNS))
def test_zero_equals_plain_single_process(runs, name):
    plain, zero = runs
    stage, accum, reference = ZERO_RUNS[name]
    final_plain, final_zero = _load(plain / f"{reference}.safetensors"), _load(zero / f"{name}.safetensors")
    assert _max_diff(_load(plain / f"{reference}.init.safetensors"), _load(zero / f"{name}.init.safetensors")) == 0.0
    assert _max_diff(final_plain, _load(plain / f"{reference}.init.safetensors")) > 0.01, "training barely moved"
    diff = _max_diff(final_plain, final_zero)
    assert diff <= TOLERANCE, f"{name}: ZeRO and plain parameters differ by {diff:.3g}"

    plain_info = _info(plain, reference, 0)
    for rank in (0, 1):
        info = _info(zero, name, rank)
        assert info["distributed_type"] == "DEEPSPEED"
        assert info["plugin_is_state_plugin"], "accelerator.state.deepspeed_plugin is not the plugin passed"
        assert info["zero_stage"] == (3 if stage == "launch" else int(stage))
        assert info["model_type"] == "DeepSpeedEngine" and info["unwrapped_type"] == "Sequential"
        # get_state_dict gives the full model on every stage, ZeRO-3 included
        assert info["state_dict_numel"] == info["full_numel"] == plain_info["state_dict_numel"]
        # the scheduler really drove the learning rate, identically, and the engine's grad norm is the plain one
        assert info["lrs"] == pytest.approx(plain_info["lrs"]) and info["lrs"][-1] < info["lrs"][0] * 0.6
        assert info["norms"] == pytest.approx(plain_info["norms"], rel=1e-4)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_zero3_holds_half_the_parameters_per_process(runs):
    _, zero = runs
    for rank in (0, 1):
        info = _info(zero, "z3", rank)
        # 1/N of every parameter, rounded up per tensor
        assert info["full_numel"] / 2 <= info["local_numel"] <= info["full_numel"] / 2 + info["num_params"]
        z2 = _info(zero, "z2", rank)
        assert z2["local_numel"] == z2["full_numel"]  # below stage 3 every process holds whole parameters
        assert info["micro_batch"] == z2["micro_batch"] == 8  # the prepared loader's per-process batch


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", CHECKPOINT_STAGES)
def test_checkpoint_resumes_in_a_new_launch(runs, stage):
    _, zero = runs
    checkpoint = zero / f"checkpoint_{stage}"
    shards = sorted(p.name for p in (checkpoint / "deepspeed").iterdir())
    assert shards == ["model_0_rank_0.pt", "model_0_rank_1.pt"]
    for shard in shards:  # plain tensors and values only: loadable without unpickling arbitrary objects
        torch.load(checkpoint / "deepspeed" / shard, weights_only=True)
    uninterrupted = _load(zero / f"uninterrupted_{stage}.safetensors")
    resumed = _load(zero / f"resumed_{stage}.safetensors")
    diff = _max_diff(uninterrupted, resumed)
    assert diff <= TOLERANCE, f"ZeRO-{stage}: resumed run ends {diff:.3g} away from the uninterrupted one"
    assert _info(zero, f"resumed_{stage}", 0)["resumed_lr"] == _info(zero, f"uninterrupted_{stage}", 0)["saved_lr"]


# -- single process: config handling and clear errors (DeepSpeed itself is not started) ---------------------
def test_conflicting_accumulation_in_config_is_one_clear_error():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4})
    with pytest.raises(DeepSpeedConfigError, match=r"gradient_accumulation_steps=4 .* is 2; give the same number"):
        Accelerator(cpu=True, gradient_accumulation_steps=2, deepspeed_plugin=plugin)


def test_config_accumulation_fills_the_accelerator_default():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4})
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    assert accelerator.gradient_accumulation_steps == 4
    assert accelerator.state.deepspeed_plugin is plugin and accelerator.distributed_type.value == "DEEPSPEED"
    # an explicit 1 is a choice, not a default: it must agree with the file
    AcceleratorState._reset_state()  # (a later Accelerator would share the plugin above, as in Accelerate)
    with pytest.raises(DeepSpeedConfigError, match="gradient_accumulation_steps"):
        Accelerator(cpu=True, gradient_accumulation_steps=1,
                    deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2},
                                                                   "gradient_accumulation_steps": 4}))


def test_bf16_in_config_without_mixed_precision_is_one_clear_error():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    with pytest.raises(DeepSpeedConfigError, match=r"bf16.enabled=True but the Accelerator's mixed_precision is 'no'; pass"):
        Accelerator(cpu=True, deepspeed_plugin=plugin)


def test_plugin_field_contradicting_file_is_an_error():
    with pytest.raises(DeepSpeedConfigError, match="zero_optimization.stage=1 .* DeepSpeedPlugin\\(zero_stage=...\\) is 3"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}}, zero_stage=3)


def test_model_without_optimizer_below_zero3_is_a_clear_error():
    # ZeRO-3 makes a forward-only engine of a model alone (tests/test_deepspeed_multi.py); stages 1-2 need an optimizer
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    with pytest.raises(ValueError, match="without an optimizer under a ZeRO stage 2 .*pass its optimizer too"):
        accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="an optimizer alone.*accelerator.prepare\\(model, optimizer"):
        accelerator.prepare(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))


def test_auto_values_filled_from_accelerator_and_objects(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                     "warmup_num_steps": "auto"}},
    }))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=0.5)
    assert plugin.resolve_accumulation(2) == 2
    optimizer = DummyOptim(torch.nn.Linear(2, 2).parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = DummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10)
    config = plugin.build_engine_config(world_size=2, mixed_precision="bf16", device_type="cpu", micro_batch_size=8,
                                        client_optimizer=False, optimizer=optimizer, scheduler=scheduler)
    assert config["train_micro_batch_size_per_gpu"] == 8 and config["train_batch_size"] == 32
    assert config["gradient_accumulation_steps"] == 2 and config["gradient_clipping"] == 0.5
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
    assert config["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1, "torch_adam": True}
    assert config["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10}
    with pytest.raises(DeepSpeedConfigError, match="train_micro_batch_size_per_gpu=4 .* is 8"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 4,
                                      "gradient_accumulation_steps": 1}).build_engine_config(
            world_size=2, mixed_precision="no", device_type="cpu", micro_batch_size=8, client_optimizer=True)
    with pytest.raises(DeepSpeedConfigError, match="defines an optimizer and the code passed a torch optimizer"):
        plugin.build_engine_config(world_size=2, mixed_precision="bf16", device_type="cpu", micro_batch_size=8,
                                   client_optimizer=True)


def test_from_launch_config():
    plugin = DeepSpeedPlugin.from_launch_config({"zero_stage": 1, "gradient_accumulation_steps": 4, "gradient_clipping": 0.5,
                                                 "offload_optimizer_device": "cpu"})
    assert plugin.zero_stage == 1 and plugin.get_value("gradient_accumulation_steps") == 4
    assert plugin.get_value("zero_optimization.offload_optimizer.device") == "cpu"
    assert plugin.get_value("gradient_clipping") == 0.5


def test_shards_without_a_layout_resume_only_on_their_own_count():
    from hasten.strategies.deepspeed.checkpoint import reshard

    class Engine:  # what reshard asks of the engine before it needs a layout
        def zero_optimization_stage(self):
            return 2

    older = {"format": 1, "zero_stage": 2, "world_size": 2, "fp32": [torch.zeros(4)], "base_optimizer": {}}
    with pytest.raises(ValueError, match=r"^the checkpoint was saved by 2 processes without the parameter layout that "
                                         r"re-partitioning needs \(an older hasten\); resume it on that many processes\.$"):
        reshard([older, {**older, "rank": 1}], Engine())


def test_fp16_on_cpu_is_one_clear_error():
    with pytest.raises(ValueError, match="fp16 on CPUs"):
        Accelerator(cpu=True, mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_zero3_bf16_trains_like_fp32(tmp_path):
    """DeepSpeed casts the model to bf16 (no GradScaler, no double cast); the losses follow the fp32 run's."""
    launch("ds_precision.py", str(tmp_path), "3", "no", "bf16", num_processes=2, timeout=300)
    fp32, bf16 = (json.loads((tmp_path / f"{p}.json").read_text()) for p in ("no", "bf16"))
    assert fp32["dtype"] == "torch.float32" and bf16["dtype"] == "torch.bfloat16"
    assert bf16["losses"] != fp32["losses"]  # the precision really changed the arithmetic
    assert bf16["losses"] == pytest.approx(fp32["losses"], abs=0.02)
    assert sum(bf16["losses"][-8:]) < sum(bf16["losses"][:8])
