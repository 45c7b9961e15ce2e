"""Several DeepSpeed plugins in one run (Accelerate's named `deepspeed_plugins`) and fp8 on a DeepSpeed engine.

Three kinds of evidence:
- in this process: which plugin is active, how it is selected, what is refused (no engine is started);
- 2 processes over gloo (`tests/scripts/ds_multi.py`): a ZeRO-2 student trained beside a frozen ZeRO-3 teacher equals
  the student trained alone against the plain teacher's outputs; a checkpoint of both engines resumes bit for bit in
  a new launch; a second Accelerator shares the plugins and trains a second model; fp8 trains on ZeRO-2 and ZeRO-3;
- against Accelerate itself, one process (its DeepSpeed path runs on a CPU with one process only): the same
  script's step losses, bit for bit (`tests/scripts/ds_peer_pair.py`).
"""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from conftest import SCRIPTS, launch, run_with_timeout  # noqa: E402
from parity.harness import cached_output, peer_entry, store_cached  # noqa: E402
from hasten import Accelerator  # noqa: E402
from hasten.state import AcceleratorState  # noqa: E402
from hasten.utils.deepspeed import DeepSpeedConfigError, DeepSpeedPlugin, get_active_deepspeed_plugin  # noqa: E402

SAVE_AT = 5  # tests/scripts/ds_multi.py's


@pytest.fixture(autouse=True)
def _fresh_run_state():
    """Named plugins are shared by every later Accelerator of the process (as in Accelerate): forget them after each test."""
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def _named(**stages: int) -> dict[str, DeepSpeedPlugin]:
    return {name: DeepSpeedPlugin(zero_stage=stage) for name, stage in stages.items()}


# -- which plugin is active (this process; no engine is started) -----------------------------------------------------
def test_first_plugin_is_active_and_select_switches():
    plugins = _named(student=2, teacher=3)
    student, teacher = plugins.values()
    accelerator = Accelerator(deepspeed_plugins=plugins)
    assert accelerator.distributed_type.value == "DEEPSPEED"
    assert student.selected and not teacher.selected
    assert get_active_deepspeed_plugin(accelerator.state) is student and accelerator.deepspeed_plugin is student
    assert accelerator.state.deepspeed_plugins is plugins and accelerator.state.get_deepspeed_plugin("teacher") is teacher
    accelerator.state.select_deepspeed_plugin("teacher")
    assert teacher.selected and not student.selected
    assert get_active_deepspeed_plugin(accelerator.state) is teacher and accelerator.deepspeed_plugin is teacher
    assert AcceleratorState().deepspeed_plugin is teacher  # a library's own AcceleratorState() sees the same
    assert accelerator.strategy.current_plugin() is teacher  # what the next prepare sets a model up under
    accelerator.state.select_deepspeed_plugin("student")
    assert student.selected and not teacher.selected and accelerator.deepspeed_plugin is student


def test_deepspeed_plugin_is_an_alias_taking_the_dict_too():
    plugins = _named(a=2, b=3)
    accelerator = Accelerator(deepspeed_plugin=plugins)
    assert accelerator.deepspeed_plugin is plugins["a"] and accelerator.state.deepspeed_plugins is plugins


def test_selected_is_only_set_through_the_state():
    plugins = _named(student=2, teacher=3)
    with pytest.raises(ValueError, match="select_deepspeed_plugin"):
        plugins["student"].select()
    accelerator = Accelerator(deepspeed_plugins=plugins)
    accelerator.state.select_deepspeed_plugin("student")
    with pytest.raises(NotImplementedError, match="select_deepspeed_plugin"):
        plugins["student"].selected = False
    assert plugins["student"].selected


def test_a_later_accelerator_shares_the_named_plugins_and_takes_no_new_ones():
    plugins = _named(zero2=2, zero3=3)
    first = Accelerator(deepspeed_plugins=plugins)
    first.state.select_deepspeed_plugin("zero3")
    second = Accelerator()
    assert second.distributed_type.value == "DEEPSPEED" and second.state.deepspeed_plugins is plugins
    assert second.deepspeed_plugin is plugins["zero3"]  # the selection is the process's, not reset by a new Accelerator
    assert second.strategy.current_plugin() is plugins["zero3"]
    with pytest.raises(NotImplementedError, match="shares; create this one without deepspeed_plugin"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))


def test_one_plugin_is_shared_too_as_in_accelerate():
    plugin = DeepSpeedPlugin(zero_stage=2)
    first = Accelerator(deepspeed_plugin=plugin)
    second = Accelerator(cpu=True)
    assert second.distributed_type.value == "DEEPSPEED" and second.deepspeed_plugin is plugin
    assert first.distributed_type.value == "DEEPSPEED"  # the later Accelerator did not turn the first one's run plain
    with pytest.raises(NotImplementedError, match="AcceleratorState._reset_state"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    AcceleratorState._reset_state()  # starts over: a plain run again
    assert Accelerator(cpu=True).distributed_type.value != "DEEPSPEED"


def test_bad_named_plugins_are_refused_in_one_sentence():
    with pytest.raises(TypeError, match="must be a hasten DeepSpeedPlugin, got object"):
        Accelerator(deepspeed_plugins={"student": DeepSpeedPlugin(), "teacher": object()})
    AcceleratorState._reset_state()
    with pytest.raises(ValueError, match="empty dict"):
        Accelerator(deepspeed_plugins={})
    AcceleratorState._reset_state()
    accelerator = Accelerator(deepspeed_plugins=_named(student=2, teacher=3))
    with pytest.raises(KeyError, match=r"no DeepSpeedPlugin is named 'techer'; .* \['student', 'teacher'\]"):
        accelerator.state.select_deepspeed_plugin("techer")
    AcceleratorState._reset_state()
    with pytest.raises(ValueError, match="select_deepspeed_plugin needs DeepSpeed"):
        Accelerator(cpu=True).state.select_deepspeed_plugin("student")


def test_every_named_plugin_is_checked_against_the_precision():
    fp16_file = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}})
    with pytest.raises(DeepSpeedConfigError, match="fp16.enabled=True but the Accelerator's mixed_precision is 'bf16'"):
        Accelerator(mixed_precision="bf16", deepspeed_plugins={"student": DeepSpeedPlugin(zero_stage=2),
                                                                "teacher": fp16_file})


def test_a_model_alone_needs_zero3_or_stays_unwrapped():
    accelerator = Accelerator(deepspeed_plugins=_named(student=2, teacher=3))
    with pytest.raises(ValueError, match="without an optimizer under a ZeRO stage 2 .* select a ZeRO-3 plugin"):
        accelerator.prepare(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="an optimizer alone"):
        accelerator.prepare(torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1))
    kept = torch.nn.Linear(4, 4)
    assert accelerator.prepare_model(kept, evaluation_mode=True) is kept  # Accelerate's way to leave it unwrapped


def test_forward_only_engine_config_has_no_optimizer():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
                                           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}})
    plugin.resolve_accumulation(1, given=False)
    config = plugin.build_engine_config(world_size=2, mixed_precision="bf16", device_type="cpu", micro_batch_size=4,
                                        client_optimizer=None)
    assert "scheduler" not in config and "optimizer" not in config and config["train_batch_size"] == 8
    with_optimizer = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}})
    with_optimizer.resolve_accumulation(1, given=False)
    with pytest.raises(DeepSpeedConfigError, match="defines one, which nothing would step"):
        with_optimizer.build_engine_config(world_size=1, mixed_precision="no", device_type="cpu", micro_batch_size=4,
                                           client_optimizer=None)


# -- fp8 on a DeepSpeed engine: the decisions -------------------------------------------------------------------------
def test_fp8_engine_is_bf16():
    pytest.importorskip("torchao")
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    plugin.check_mixed_precision("fp8")  # a bf16 section is what fp8 needs
    plugin.resolve_accumulation(1, given=False)
    config = plugin.build_engine_config(world_size=1, mixed_precision="fp8", device_type="cpu", micro_batch_size=2,
                                        client_optimizer=True)
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
    fp16 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}})
    with pytest.raises(DeepSpeedConfigError, match="fp16.enabled=True but the Accelerator's mixed_precision is 'fp8'"):
        fp16.check_mixed_precision("fp8")


def test_fp8_under_deepspeed_drops_the_fsdp_all_gather_it_was_not_asked_for(monkeypatch):
    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig

    from hasten.fp8.setup import Fp8Setup
    from hasten.utils import AORecipeKwargs

    monkeypatch.delenv("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", raising=False)
    cpu = torch.device("cpu")
    default = Fp8Setup.resolve([], "fp8", cpu, deepspeed=True)
    assert default.backend.value == "AO" and not default.ao_recipe_handler.config.enable_fsdp_float8_all_gather
    assert Fp8Setup.resolve([], "fp8", cpu).ao_recipe_handler.config.enable_fsdp_float8_all_gather  # FSDP's default
    kept = AORecipeKwargs(pad_inner_dim=False)
    assert not Fp8Setup.resolve([kept], "fp8", cpu, deepspeed=True).ao_recipe_handler.config.pad_inner_dim
    for asked in (AORecipeKwargs(enable_fsdp_float8_all_gather=True),
                  AORecipeKwargs(config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))):
        with pytest.raises(ValueError, match="float8 all-gather .* is for FSDP2"):
            Fp8Setup.resolve([asked], "fp8", cpu, deepspeed=True)
    monkeypatch.setenv("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "true")  # `--fp8_enable_fsdp_float8_all_gather`
    with pytest.raises(ValueError, match="is for FSDP2"):
        Fp8Setup.resolve([], "fp8", cpu, deepspeed=True)


def test_fp8_accelerator_with_deepspeed():
    pytest.importorskip("torchao")
    accelerator = Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert accelerator.mixed_precision == "fp8" and accelerator.fp8_backend.value == "AO"
    assert accelerator.distributed_type.value == "DEEPSPEED" and accelerator.precision.dtype is torch.bfloat16


# -- two processes over gloo ------------------------------------------------------------------------------------------
def _weights(path):
    return {k: v.double() for k, v in load_file(str(path)).items()}


def _max_diff(a, b):
    a, b = _weights(a), _weights(b)
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _facts(out, name, rank=0):
    return json.loads((out / f"{name}.rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_multi")
    launch("ds_multi.py", str(out), "pair", "alone", "two", "fp8:2", "fp8:3", num_processes=2,
           timeout=300)  # includes the one-time JIT build of DeepSpeed's CPU op on a fresh machine
    launch("ds_multi.py", str(out), "resume", num_processes=2, timeout=180)  # a new launch
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_student_beside_a_zero3_teacher_equals_the_student_alone(runs):
    assert _max_diff(runs / "pair.safetensors", runs / "alone.safetensors") == 0.0
    assert _facts(runs, "pair")["losses"] == _facts(runs, "alone")["losses"]
    assert _max_diff(runs / "pair.teacher.safetensors", runs / "alone.teacher.safetensors") == 0.0  # never changed
    for rank in (0, 1):
        facts = _facts(runs, "pair", rank)
        assert facts["first_active"] and facts["teacher_active"] and facts["teacher_type"] == "DeepSpeedEngine"
        assert facts["teacher_local_numel"] * 2 == facts["teacher_full_numel"]  # ZeRO-3: half on each process


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_checkpoint_of_both_engines_resumes_bit_for_bit(runs):
    checkpoint = runs / "checkpoint_pair" / "deepspeed"
    # the trained engine's per-process partitions; the teacher (index 1, as Accelerate's pytorch_model_1): its weights
    assert sorted(p.name for p in checkpoint.iterdir()) == ["model_0_rank_0.pt", "model_0_rank_1.pt",
                                                           "model_1_weights.pt"]
    for path in checkpoint.iterdir():
        torch.load(path, weights_only=True)
    assert _max_diff(runs / "pair.safetensors", runs / "resume.safetensors") == 0.0
    # the resumed run built its teacher from another seed: load_state put the saved one back
    assert _max_diff(runs / "pair.teacher.safetensors", runs / "resume.teacher.safetensors") == 0.0
    for rank in (0, 1):
        assert _facts(runs, "resume", rank)["losses"] == _facts(runs, "pair", rank)["losses"][SAVE_AT:]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_second_accelerator_trains_a_second_model_under_the_other_plugin(runs):
    facts = _facts(runs, "two")
    assert facts == {"second_is_deepspeed": True, "second_shares": True, "b_partitioned": True}
    assert _max_diff(runs / "two.safetensors", runs / "two.plain.safetensors") <= 1e-5  # ZeRO-2 model
    assert _max_diff(runs / "two.b.safetensors", runs / "two.plain.safetensors") <= 1e-5  # ZeRO-3 model
    assert _max_diff(runs / "two.plain.safetensors", runs / "alone.safetensors") > 1e-3  # (a different training)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_fp8_trains_on_zero2_and_zero3(runs):
    for stage in (2, 3):
        facts = _facts(runs, f"fp8_{stage}")
        assert facts["layers"] == ["Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
        assert facts["mixed_precision"] == "fp8" and facts["bf16_engine"] and facts["stage"] == stage
        assert facts["weight_dtype"] == "torch.bfloat16" and facts["config_bf16"] == {"enabled": True}
        losses = facts["losses"]
        assert sum(losses[-6:]) < 0.8 * sum(losses[:6]), losses
    assert _max_diff(runs / "fp8_2.safetensors", runs / "fp8_3.safetensors") == 0.0


# -- against Accelerate, one process ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(lib: str, scenario: str) -> list[str]:
    import importlib.metadata as md

    # Accelerate's lines are kept as the parity suite keeps its peer runs (a DeepSpeed interpreter is ~10 CPU-s)
    entry = peer_entry(SCRIPTS / "ds_peer_pair.py", 1, [scenario, md.version("deepspeed")]) if lib == "accelerate" \
        else None
    cached = cached_output(entry)
    if cached is not None:
        return cached.splitlines()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "HASTEN_"))}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = run_with_timeout([sys.executable, str(SCRIPTS / "ds_peer_pair.py"), lib, scenario], 240, env,
                              leftovers_fail=lib == "hasten")
    assert result.returncode == 0, f"{lib} {scenario}:\n{result.stdout}\n{result.stderr[-3000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith(("LOSS", "LAYERS"))]
    assert len(lines) >= 12, result.stdout
    store_cached(entry, None, "\n".join(lines))
    return lines


@pytest.mark.parity
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["pair:no", "pair:bf16", "fp8:3"])
def test_same_losses_as_accelerate(scenario):
    pytest.importorskip("accelerate")
    if scenario.startswith("fp8"):
        pytest.importorskip("torchao")
    ours = _losses("hasten", scenario)
    assert _losses("accelerate", scenario) == ours


# -- Transformer Engine on a DeepSpeed engine, against the stand-in TE of tests/test_fp8_te.py ------------------------
from test_fp8_te import fake_te  # noqa: E402,F401  (the fixture: TE's modules as recording torch layers)


def test_transformer_engine_under_deepspeed_with_a_stand_in(fake_te):  # noqa: F811
    """The layers converted before the engine is built, and every forward inside TE's fp8_autocast with the recipe of
    the `TERecipeKwargs` given (Accelerate passes only the deprecated FP8RecipeKwargs' fields there). TE's kernels
    themselves are untested (no GPU)."""
    from hasten.utils import TERecipeKwargs

    accelerator = Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2),
                              kwargs_handlers=[TERecipeKwargs(margin=2, amax_history_len=16)])
    assert accelerator.fp8_backend.value == "TE"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(torch.randn(16, 16, generator=torch.Generator().manual_seed(1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert type(model).__name__ == "DeepSpeedEngine" and model.bfloat16_enabled()
    assert [type(m) for m in model.module] == [fake_te.te.Linear, torch.nn.ReLU, fake_te.te.Linear]
    fake_te.clear()
    losses = []
    for x in loader:
        loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert len(fake_te.autocasts) == 4 and all(enabled for enabled, _ in fake_te.autocasts)
    recipe = fake_te.autocasts[0][1]
    assert recipe.kwargs["margin"] == 2 and recipe.kwargs["amax_history_len"] == 16
    assert {enabled for _, enabled, _ in fake_te.forwards} == {True}
    assert losses[-1] < losses[0]
