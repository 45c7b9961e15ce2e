"""torch.compile through the Accelerator: whole-model and regional compilation (hasten.runtime.regional).

The "eager" and "aot_eager" backends run dynamo's capture (and AOTAutograd's forward/backward split) without code
generation, so the structure and the numerics are checked in a few seconds.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

OptimizedModule = torch._dynamo.eval_frame.OptimizedModule


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _compiled_names(model: nn.Module) -> list[str]:
    return sorted(name for name, m in model.named_modules() if isinstance(m, OptimizedModule))


def test_compile_regions_wraps_each_block_keeps_the_original_and_matches_accelerate():
    from accelerate.utils import compile_regions as peer_compile_regions

    from hasten.utils import compile_regions, extract_model_from_parallel, has_compiled_regions

    torch.manual_seed(0)
    net, x = Net(), torch.randn(5, 4)
    expected = net(x)
    compiled = compile_regions(net, backend="eager")
    assert compiled is not net and type(compiled) is Net and has_compiled_regions(compiled)
    assert all(isinstance(block, OptimizedModule) for block in compiled.blocks)
    assert _compiled_names(compiled) == _compiled_names(peer_compile_regions(net, backend="eager"))
    assert sorted(compiled.state_dict()) == sorted(peer_compile_regions(net, backend="eager").state_dict())
    assert torch.equal(compiled(x), expected)
    assert not has_compiled_regions(net)  # the original is untouched
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is net
    assert extract_model_from_parallel(compiled) is compiled
    wrapped = nn.parallel.DataParallel(net)  # a wrapped original is put back under the compiled container
    compiled.__dict__["_orig_mod"] = wrapped
    assert extract_model_from_parallel(compiled) is compiled and compiled.__dict__["_orig_mod"] is net


def test_in_place_regions_compile_blocks_and_leaves_not_containers():
    from hasten.utils import compile_regions_deepspeed, compile_regions_fsdp2

    net = Net()
    keys = list(net.state_dict())
    assert compile_regions_fsdp2(net, backend="eager") is net and list(net.state_dict()) == keys
    compiled = {name for name, m in net.named_modules() if m._compiled_call_impl is not None}
    assert compiled == {"embed", "head", "blocks.0", "blocks.1", "blocks.2"}
    plain = nn.Linear(2, 2)
    assert compile_regions_deepspeed(plain, backend="eager") is None and plain._compiled_call_impl is not None


def _train(plugin: object, steps: int = 3) -> tuple[list[float], nn.Module]:
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    torch.manual_seed(0)
    net, data = Net(), torch.randn(steps, 6, 4)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin) if plugin is not None else Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    losses = []
    for batch in data:
        loss = model(batch).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model


def test_regional_compile_trains_as_eager():
    # aot_eager: inductor gives the same losses here (checked by hand) but its first compile takes ~19 s on this CPU;
    # benchmarks/compile.py runs it
    from hasten.utils import TorchDynamoPlugin, extract_model_from_parallel

    torch._dynamo.reset()
    eager, _ = _train(None)
    regional, model = _train(TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True))
    assert regional == pytest.approx(eager, abs=1e-6)
    # compiled in place: each block and each leaf part, not the model as a whole; nothing to unwrap
    assert model._compiled_call_impl is None
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert extract_model_from_parallel(model, keep_torch_compile=False) is model


def test_whole_compile_trains_as_eager_and_a_compiled_model_is_not_compiled_again():
    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    eager, _ = _train(None)
    whole, model = _train(TorchDynamoPlugin(backend="aot_eager"))
    assert whole == pytest.approx(eager, abs=1e-6) and model._compiled_call_impl is not None
    already = torch.compile(nn.Linear(2, 2), backend="eager")
    assert Accelerator(cpu=True, dynamo_backend="eager").prepare(already)._orig_mod._compiled_call_impl is None


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_torchs_own_modules_really_compile_whole_and_by_regions():
    # nn.Module.compile() alone compiles nothing for torch's own classes (dynamo skips their frames)
    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    torch._dynamo.reset()
    before = _graphs()
    seq = Accelerator(cpu=True, dynamo_backend="eager").prepare(nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1)))
    seq(torch.ones(3, 2)).sum().backward()
    assert _graphs() == before + 1
    stack = nn.Sequential(nn.Linear(4, 16), nn.ModuleList(
        [nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True) for _ in range(6)]))
    x = torch.randn(2, 5, 4)
    expected = stack[1][5](stack[1][4](stack[1][3](stack[1][2](stack[1][1](stack[1][0](stack[0](x)))))))
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    model = Accelerator(cpu=True, dynamo_plugin=plugin).prepare(stack)
    before = _graphs()
    out = model[0](x)
    for block in model[1]:
        out = block(out)
    assert torch.allclose(out, expected, atol=1e-6)
    assert 2 <= _graphs() - before <= 3  # the Linear and the blocks: 6 blocks share one graph (or two)


def test_unset_settings_come_from_accelerates_variables_as_in_accelerate(monkeypatch):
    from accelerate.utils import TorchDynamoPlugin as PeerPlugin

    from hasten import Accelerator
    from hasten.utils import TorchDynamoPlugin

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    plugin, peer = Accelerator(cpu=True).dynamo_plugin, PeerPlugin()
    assert plugin.enabled and plugin.backend.value == peer.backend.value == "EAGER"
    assert plugin.use_regional_compilation is peer.use_regional_compilation is True
    assert plugin.dynamic is peer.dynamic is False
    assert TorchDynamoPlugin(backend="no", use_regional_compilation=False).use_regional_compilation is False


def test_launch_compile_flags_reach_the_scripts_accelerator_as_under_accelerate_launch(tmp_path):
    """`hasten launch --dynamo_backend ...` (or a config file's dynamo_config) compiles as `accelerate launch` does."""
    import json

    from conftest import launch

    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys, torch\nfrom hasten import Accelerator\n"
        "accelerator = Accelerator(cpu=True)\nmodel = accelerator.prepare(torch.nn.Linear(2, 2))\n"
        "plugin = accelerator.dynamo_plugin\n"
        "print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith('ACCELERATE_DYNAMO_')},"
        " 'backend': plugin.backend.value, 'mode': plugin.mode, 'regional': plugin.use_regional_compilation,"
        " 'compiled': model._compiled_call_impl is not None}))\n")
    config = tmp_path / "config.yaml"
    config.write_text("use_cpu: true\ndynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: reduce-overhead\n")
    flags = ("--config_file", str(config), "--dynamo_backend", "eager", "--dynamo_use_regional_compilation")
    seen = json.loads(launch(script, num_processes=1, launch_args=flags).stdout.strip().splitlines()[-1])
    # the flag beat the file's backend; dynamic shapes unsaid stay torch.compile's choice (no variable, as 1.16)
    assert seen["env"] == {"ACCELERATE_DYNAMO_BACKEND": "EAGER", "ACCELERATE_DYNAMO_MODE": "reduce-overhead",
                           "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
                           "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "True"}
    assert (seen["backend"], seen["mode"], seen["regional"]) == ("EAGER", "reduce-overhead", True)
    plain = json.loads(launch(script, num_processes=1, launch_args=("--cpu",)).stdout.strip().splitlines()[-1])
    assert plain["env"]["ACCELERATE_DYNAMO_BACKEND"] == "NO" and not plain["compiled"]
    config.write_text("use_cpu: true\ndynamo_config:\n  dynamo_backend: turbo\n")
    refused = launch(script, num_processes=1, launch_args=("--config_file", str(config)), check=False)
    assert refused.returncode != 0 and "dynamo_backend 'turbo' is not a torch.compile backend" in refused.stderr
