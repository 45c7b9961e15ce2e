"""fp8 through torchao: Accelerate's conversion filter, the same losses bit for bit, FSDP2's float8 all-gather, refusals.

The differential tests run `scripts/fp8_train.py` (written for Accelerate) under Accelerate 1.16 and under
hasten: the layers Accelerate's own `convert_model_to_fp8_ao` converts, the losses and the final parameters
must be identical. On this CPU the default recipe runs torch's CPU fp8 matrix product (`torch._scaled_mm`),
as under Accelerate; `emulate` is torchao's emulation.

Under Accelerate the default recipe (float8 all-gather) replaces each converted weight by a new Parameter,
and an optimizer built before `prepare` keeps the old ones: the fp8 layers never train. hasten points the
optimizer at the new Parameters, so the reference is Accelerate with the optimizer built after `prepare(model)`
(`--late-optimizer`), where it trains them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from importlib.util import find_spec

import pytest
import torch

from conftest import SCRIPTS, run_with_timeout

pytestmark = pytest.mark.skipif(find_spec("torchao") is None, reason="fp8 needs torchao (the test extra installs it)")
SCRIPT = SCRIPTS / "fp8_train.py"
# What Accelerate's default filter converts in fp8_train.Net: not embed/head (first and last Linear), not `odd` (24 % 16).
CONVERTED = ["blocks.0.down", "blocks.0.up", "blocks.1.down", "blocks.1.up"]


def _records(command: list[str], timeout: float = 120) -> dict[str, dict]:
    peer = "accelerate.commands.launch" in command  # Accelerate's ranks may hang in torch's exit: killed, not counted
    run = run_with_timeout(command, timeout, {**os.environ, "PYTHONUNBUFFERED": "1"}, leftovers_fail=not peer)
    assert run.returncode == 0, f"{' '.join(command)} exited {run.returncode}:\n{run.stdout}\n{run.stderr[-3000:]}"
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {line["case"]: line for line in lines}


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def one_process() -> dict[str, dict[str, dict]]:
    cases = ["--cases", "default,emulate,filter"]
    return {"accelerate": _records([sys.executable, str(SCRIPT), "--lib", "accelerate", *cases, "--late-optimizer"]),
            "hasten": _records([sys.executable, str(SCRIPT), "--lib", "hasten", *cases])}


def test_the_same_layers_become_float8_as_under_accelerate(one_process):
    peer, ours = one_process["accelerate"], one_process["hasten"]
    assert peer["default"]["converted"] == ours["default"]["converted"] == CONVERTED
    assert peer["emulate"]["converted"] == ours["emulate"]["converted"] == CONVERTED
    assert peer["filter"]["converted"] == ours["filter"]["converted"] == ["blocks.0.up", "blocks.1.up"]


def test_losses_and_parameters_are_bitwise_accelerates(one_process):
    for case in ("default", "emulate", "filter"):
        peer, ours = one_process["accelerate"][case], one_process["hasten"][case]
        assert ours["losses"] == peer["losses"] and ours["params"] == peer["params"], case
        assert ours["frozen"] == peer["frozen"] == [], case  # every parameter trained, the fp8 layers' too
    # emulation is really another computation: its parameters differ from those of torch's CPU fp8 kernel
    assert one_process["hasten"]["emulate"]["params"] != one_process["hasten"]["default"]["params"]


def test_accelerator_fp8_attributes_match_accelerate(one_process):
    keys = ("backend", "enabled", "emulate", "all_gather", "pad_inner_dim", "mixed_precision", "weights")
    for case in ("default", "emulate"):
        peer, ours = one_process["accelerate"][case], one_process["hasten"][case]
        assert {k: ours[k] for k in keys} == {k: peer[k] for k in keys}
    assert one_process["hasten"]["default"]["backend"] == "AO" and one_process["hasten"]["default"]["all_gather"]


@pytest.mark.multiprocess
def test_fsdp2_float8_all_gather_trains_as_accelerate_ddp(tmp_path):
    """FSDP2 gathers the weights in fp8 (torchao's tensor subclass) over gloo, trains exactly as DDP, resumes exactly.

    With a precision policy that keeps fp32: by default fp8 under FSDP computes and reduces in bf16 (Accelerate's
    set_mixed_precision maps "fp8" to bf16), which DDP does not.
    """
    peer = _records([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
                     "--mixed_precision", "no", "--dynamo_backend", "no", "--num_processes", "2",
                     "--main_process_port", _port(), str(SCRIPT), "--lib", "accelerate", "--late-optimizer"])["default"]
    ours = _records([sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--main_process_port", _port(),
                     "--use_fsdp", "--fsdp_version", "2", str(SCRIPT), "--lib", "hasten", "--fsdp-fp32",
                     "--resume-check", str(tmp_path / "ckpt")])["default"]
    assert (peer["distributed_type"], ours["distributed_type"], ours["processes"]) == ("MULTI_CPU", "FSDP", 2)
    assert ours["weights"] == ["WeightWithDynamicFloat8CastTensor"] and ours["converted"] == CONVERTED
    assert ours["policy"] == "torch.float32"
    assert ours["losses"] == peer["losses"] and ours["params"] == peer["params"] and ours["frozen"] == []
    assert ours["resumed"] is True  # save_state, 2 steps, load_state: the same 2 steps (the fp8 scales recomputed)


# -- in process: choices and refusals -----------------------------------------------------------------------------

def test_mixed_precision_fp8_alone_picks_torchao_with_accelerates_recipe():
    from hasten import Accelerator
    from hasten.utils import FP8BackendType

    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    config = accelerator.ao_recipe_handler.config
    assert accelerator.fp8_backend is FP8BackendType.AO and accelerator.fp8_enabled and accelerator.has_fp8_handler
    assert (config.pad_inner_dim, config.enable_fsdp_float8_all_gather, config.emulate) == (True, True, False)
    assert accelerator.mixed_precision == "fp8" and accelerator.native_amp
    model = accelerator.prepare(torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]))
    assert [type(m).__name__ for m in model] == ["Linear", "Float8Linear", "Linear"]
    assert model(torch.randn(2, 16)).dtype == torch.float32  # bf16 autocast inside, outputs cast back as Accelerate


def test_an_optimizer_built_before_prepare_trains_the_fp8_layers():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert all(id(p) in held for p in model.parameters())  # torchao's new Parameters, not the replaced ones
    before = model[1].weight._tensor.detach().clone()
    accelerator.backward(model(torch.randn(8, 32)).pow(2).mean())
    optimizer.step()
    assert not torch.equal(model[1].weight._tensor, before)


def test_without_fp8_nothing_is_converted():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    assert accelerator.fp8_backend.value == "NO" and not accelerator.fp8_enabled and accelerator.ao_recipe_handler is None
    model = accelerator.prepare(torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]))
    assert {type(m).__name__ for m in model} == {"Linear"}


def test_a_recipe_without_fp8_is_refused():
    from hasten import Accelerator
    from hasten.utils import AORecipeKwargs

    with pytest.raises(ValueError, match="AORecipeKwargs configures fp8 training; pass mixed_precision='fp8'"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])


def test_gpus_without_fp8_are_refused_unless_emulated():
    from torchao.float8 import Float8LinearConfig

    from hasten.fp8.setup import Fp8Setup
    from hasten.utils import AORecipeKwargs

    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer.*this one has 8.0; use mixed_precision='bf16'"):
        Fp8Setup.resolve([], "fp8", cuda, capability=(8, 0))
    assert Fp8Setup.resolve([], "fp8", cuda, capability=(9, 0)).backend.value == "AO"
    emulated = AORecipeKwargs(config=Float8LinearConfig(emulate=True))
    assert Fp8Setup.resolve([emulated], "fp8", cuda, capability=(7, 5)).ao_recipe_handler is emulated


def test_other_backends_refuse_in_one_sentence(monkeypatch):
    import hasten.utils
    from hasten.fp8.setup import Fp8Setup
    from hasten.utils import AORecipeKwargs, TERecipeKwargs

    # Accelerate 1.16 removed MS-AMP and the deprecated FP8RecipeKwargs: so does hasten, and MSAMP is no backend
    assert not hasattr(hasten.utils, "MSAMPRecipeKwargs") and not hasattr(hasten.utils, "FP8RecipeKwargs")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "MSAMP")
    with pytest.raises(ValueError, match="ACCELERATE_FP8_BACKEND='MSAMP' is not an fp8 backend; use AO"):
        Fp8Setup.resolve([], "fp8", torch.device("cpu"))
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND")
    if find_spec("transformer_engine") is None:
        with pytest.raises(ImportError, match=r"TERecipeKwargs needs NVIDIA Transformer Engine.*pip install"):
            TERecipeKwargs(fp8_format="HYBRID")
    # under DeepSpeed the default recipe drops FSDP2's float8 all-gather (tests/test_deepspeed_multi.py)
    assert not Fp8Setup.resolve([], "fp8", torch.device("cpu"), deepspeed=True).ao_recipe_handler.config \
        .enable_fsdp_float8_all_gather
    with pytest.raises(ValueError, match="set those fields on the Float8LinearConfig"):
        AORecipeKwargs(config=AORecipeKwargs().config, pad_inner_dim=False)


def test_save_state_and_resume_with_float8_all_gather_weights(tmp_path):
    """The default recipe wraps weights in torchao's tensor subclass even on one process; checkpoints hold plain tensors."""
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert type(model[1].weight).__name__ == "WeightWithDynamicFloat8CastTensor"
    x = torch.randn(8, 32)

    def step() -> float:
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    step()
    accelerator.save_state(tmp_path / "ckpt")
    before = [step() for _ in range(2)]
    accelerator.load_state(tmp_path / "ckpt")
    assert [step() for _ in range(2)] == before
    assert all(type(t) is torch.Tensor for t in accelerator.get_state_dict(model).values())
