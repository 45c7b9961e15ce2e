"""fp8 through Transformer Engine, against Accelerate 1.16 driving the same stand-in TE in this process.

TE installs only beside an NVIDIA GPU, so `FakeTE` stands in for it: ``transformer_engine.pytorch``'s
`Linear`/`LayerNorm` are torch's layers that record each forward (inside which `fp8_autocast`, with which
recipe), `fp8_autocast` records its arguments, ``transformer_engine.common.recipe``'s `DelayedScaling`
records its keyword arguments. Accelerate's own `Accelerator` and `TERecipeKwargs` run against the same
stand-in: the layers converted, the weights, the recipe, the autocast per mode and the losses must be
Accelerate's. What this cannot check is TE's kernels (real fp8 numerics on a GPU): `scripts/gpu_check`.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import importlib.machinery
import os
import sys
import types
from typing import Any, Iterator

import pytest
import torch
from torch import nn

import hasten.core.availability
import hasten.fp8.te
from hasten.state import AcceleratorState


class FakeTE:
    """The stand-in ``transformer_engine`` modules, and what they saw."""

    def __init__(self) -> None:
        self.autocasts: list[tuple[bool, Any]] = []  # (enabled, recipe) per fp8_autocast entered
        self.forwards: list[tuple[str, bool, Any]] = []  # (layer kind, autocast enabled, recipe) per TE forward
        self._state: dict[str, Any] = {"enabled": False, "recipe": None}
        fake = self

        @contextlib.contextmanager
        def fp8_autocast(enabled: bool = True, fp8_recipe: Any = None, **kwargs: Any) -> Iterator[None]:
            fake.autocasts.append((enabled, fp8_recipe))
            before = dict(fake._state)
            fake._state.update(enabled=enabled, recipe=fp8_recipe)
            try:
                yield
            finally:
                fake._state.update(before)

        class Linear(nn.Linear):
            def __init__(self, in_features: int, out_features: int, bias: bool = True, params_dtype: Any = None) -> None:
                super().__init__(in_features, out_features, bias=bias, dtype=params_dtype)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                fake.forwards.append(("Linear", fake._state["enabled"], fake._state["recipe"]))
                return super().forward(x)

        class LayerNorm(nn.LayerNorm):
            def __init__(self, hidden_size: int, eps: float = 1e-5, params_dtype: Any = None) -> None:
                super().__init__(hidden_size, eps=eps, dtype=params_dtype)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                fake.forwards.append(("LayerNorm", fake._state["enabled"], fake._state["recipe"]))
                return super().forward(x)

        class Recipe:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs = kwargs

        self.Format = enum.Enum("Format", ["E4M3", "E5M2", "HYBRID"])
        self.modules = {
            "transformer_engine": self._module("transformer_engine", package=True),
            "transformer_engine.pytorch": self._module("transformer_engine.pytorch", package=True, Linear=Linear,
                                                       LayerNorm=LayerNorm, TransformerLayer=type("TransformerLayer", (nn.Module,), {}),
                                                       fp8_autocast=fp8_autocast),
            "transformer_engine.pytorch.fp8": self._module("transformer_engine.pytorch.fp8",
                                                           check_mxfp8_support=lambda: (False, "the stand-in has no MXFP8")),
            "transformer_engine.common": self._module("transformer_engine.common", package=True),
            "transformer_engine.common.recipe": self._module(
                "transformer_engine.common.recipe", Format=self.Format, DelayedScaling=type("DelayedScaling", (Recipe,), {}),
                MXFP8BlockScaling=type("MXFP8BlockScaling", (Recipe,), {})),
        }
        self.modules["transformer_engine"].pytorch = self.modules["transformer_engine.pytorch"]
        self.modules["transformer_engine"].common = self.modules["transformer_engine.common"]
        self.modules["transformer_engine.pytorch"].fp8 = self.modules["transformer_engine.pytorch.fp8"]
        self.modules["transformer_engine.common"].recipe = self.modules["transformer_engine.common.recipe"]
        self.te = self.modules["transformer_engine.pytorch"]

    @staticmethod
    def _module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)  # find_spec sees it
        module.__dict__.update(attrs)
        return module

    def clear(self) -> None:
        self.autocasts.clear()
        self.forwards.clear()


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTE]:
    """The stand-in TE installed for hasten (its probe) and for Accelerate (whose probe also asks for package metadata)."""
    import accelerate.accelerator
    import accelerate.utils.dataclasses
    import accelerate.utils.transformer_engine

    fake = FakeTE()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for peer in (accelerate.accelerator, accelerate.utils.dataclasses, accelerate.utils.transformer_engine):
        monkeypatch.setattr(peer, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(hasten.fp8.te, "TE_DEVICE_TYPES", ("cuda", "cpu"))  # the stand-in runs on the CPU
    for name in [n for n in os.environ if n.startswith("ACCELERATE_FP8_")]:
        monkeypatch.delenv(name)
    hasten.core.availability._installed.cache_clear()
    yield fake
    hasten.core.availability._installed.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_states() -> Iterator[None]:
    from accelerate.state import AcceleratorState as PeerState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    PeerState._reset_state(reset_partial_state=True)


class Net(nn.Module):
    """Accelerate's rules at work: `tail`'s first Linear (32 -> 24) is not a multiple of 16, which ends the
    conversion of `tail`'s later children (its LayerNorm and second Linear) but not of `head` after it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(32), "up": nn.Linear(32, 64), "down": nn.Linear(64, 32, bias=False)})
            for _ in range(2))
        self.tail = nn.Sequential(nn.Linear(32, 24), nn.LayerNorm(24), nn.Linear(24, 32))
        self.head = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block["down"](torch.relu(block["up"](block["norm"](x))))
        return self.head(self.tail(x))


CONVERTED = ["blocks.0.down", "blocks.0.norm", "blocks.0.up", "blocks.1.down", "blocks.1.norm", "blocks.1.up",
             "embed", "head"]


def _te_layers(model: nn.Module, te: Any) -> list[str]:
    return sorted(name for name, m in model.named_modules() if isinstance(m, (te.Linear, te.LayerNorm)))


def _train(accelerator: Any, model: nn.Module, optimizer: Any, steps: int = 2) -> list[float]:
    losses = []
    for step in range(steps):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
        loss = model(x).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _run(lib: str, fake: FakeTE, recipe_args: dict[str, Any]) -> dict[str, Any]:
    """Accelerator(mixed_precision="fp8", TERecipeKwargs(**recipe_args)) of `lib`: prepare, two steps, one eval forward."""
    if lib == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import TERecipeKwargs
    else:
        from hasten import Accelerator
        from hasten.utils import TERecipeKwargs
    torch.manual_seed(0)
    original = Net()
    model = copy.deepcopy(original)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(**recipe_args)])
    fake.clear()
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)
    result: dict[str, Any] = {
        "converted": _te_layers(inner, fake.te),
        "weights_copied": all(torch.equal(value, original.state_dict()[key]) for key, value in inner.state_dict().items()),
        "optimizer_holds_model": {id(p) for g in optimizer.param_groups for p in g["params"]}
        == {id(p) for p in inner.parameters()},
        "losses": _train(accelerator, model, optimizer),
        "train_autocasts": [(enabled, recipe.kwargs) for enabled, recipe in fake.autocasts],
        "train_forwards": {(kind, enabled, id(recipe)) for kind, enabled, recipe in fake.forwards},
        "recipes": {id(recipe) for _, recipe in fake.autocasts},
    }
    fake.clear()
    model.eval()
    with torch.no_grad():
        model(torch.ones(4, 16))
    result["eval_autocasts"] = [(enabled, recipe.kwargs) for enabled, recipe in fake.autocasts]
    result["eval_forwards"] = sorted({(kind, enabled) for kind, enabled, _ in fake.forwards})
    fake.clear()
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False).train()  # both autocasts removed
    result["unwrapped"] = (plain(torch.ones(4, 16)).dtype, len(fake.autocasts), type(plain).forward is plain.forward.__func__)
    return result


@pytest.mark.parametrize("recipe_args", [{}, {"fp8_format": "E4M3", "margin": 2, "amax_history_len": 16,
                                              "amax_compute_algo": "max", "use_autocast_during_eval": True}],
                         ids=["defaults", "set"])
def test_accelerator_drives_te_as_accelerate(fake_te, recipe_args):
    peer, ours = _run("accelerate", fake_te, recipe_args), _run("hasten", fake_te, recipe_args)
    assert ours["converted"] == peer["converted"] == CONVERTED
    assert ours["weights_copied"] and peer["weights_copied"]  # bit for bit
    assert ours["optimizer_holds_model"] and peer["optimizer_holds_model"]
    assert ours["losses"] == peer["losses"]
    assert ours["train_autocasts"] == peer["train_autocasts"]
    assert len(ours["recipes"]) == 1  # one recipe object, built once in prepare
    (recipe_id,) = ours["recipes"]
    # every TE layer of both steps ran inside the enabled autocast with that recipe
    assert ours["train_forwards"] == {("Linear", True, recipe_id), ("LayerNorm", True, recipe_id)}
    assert ours["eval_autocasts"] == peer["eval_autocasts"]
    assert ours["eval_forwards"] == peer["eval_forwards"]
    in_eval = recipe_args.get("use_autocast_during_eval", False)
    assert ours["eval_forwards"] == [("LayerNorm", in_eval), ("Linear", in_eval)]
    expected = {k: v for k, v in recipe_args.items() if k != "use_autocast_during_eval"}
    if "fp8_format" in expected:
        expected["fp8_format"] = fake_te.Format[expected["fp8_format"]]
    assert ours["train_autocasts"] == [(True, expected)] * 2
    assert ours["eval_autocasts"] == [(in_eval, expected)]
    assert ours["unwrapped"] == peer["unwrapped"] == (torch.float32, 0, True)


def test_env_defaults_reach_the_recipe_as_in_accelerate(fake_te, monkeypatch):
    """`hasten launch --fp8_*` exports ACCELERATE_FP8_*; the fields they set count as set (Accelerate compares to env-free defaults)."""
    from accelerate.utils import TERecipeKwargs as PeerRecipe
    from accelerate.utils.transformer_engine import apply_fp8_autowrap as peer_autowrap

    from hasten.utils import TERecipeKwargs, apply_fp8_autowrap

    for name, value in {"MARGIN": "3", "INTERVAL": "2", "FORMAT": "e5m2", "AMAX_HISTORY_LEN": "32",
                        "AMAX_COMPUTE_ALGO": "MAX", "OVERRIDE_WGRAD": "true", "USE_AUTOCAST_DURING_EVAL": "1"}.items():
        monkeypatch.setenv(f"ACCELERATE_FP8_{name}", value)
    ours, peer = TERecipeKwargs(), PeerRecipe()
    assert vars(ours) == vars(peer)
    assert ours.to_kwargs() == peer.to_kwargs()
    seen = []
    for autowrap, handler in ((peer_autowrap, peer), (apply_fp8_autowrap, ours)):
        model = autowrap(nn.Sequential(nn.Linear(16, 16)), handler)
        fake_te.clear()
        model.eval()
        model(torch.ones(1, 16))
        seen.append([(enabled, recipe.kwargs) for enabled, recipe in fake_te.autocasts])
    assert seen[0] == seen[1] == [(True, {"margin": 3, "interval": 2, "fp8_format": fake_te.Format.E5M2,
                                          "amax_history_len": 32, "amax_compute_algo": "max",
                                          "override_linear_precision": (False, False, True)})]


def test_convert_model_and_layer_probe_match_accelerates(fake_te):
    from accelerate import Accelerator as PeerAccelerator  # its convert_model asks AcceleratorState about ZeRO-3
    from accelerate.utils import convert_model as peer_convert
    from accelerate.utils import has_transformer_engine_layers as peer_has

    from hasten.utils import convert_model, has_transformer_engine_layers

    PeerAccelerator(cpu=True)
    torch.manual_seed(0)
    original = Net()
    peer_model, ours = copy.deepcopy(original), copy.deepcopy(original)
    assert not has_transformer_engine_layers(ours) and not peer_has(peer_model)
    with torch.no_grad():
        peer_convert(peer_model)
    convert_model(ours)  # hasten's needs no no_grad around it
    assert [(n, type(m).__name__) for n, m in ours.named_modules()] == \
        [(n, type(m).__name__) for n, m in peer_model.named_modules()]
    assert _te_layers(ours, fake_te.te) == CONVERTED
    assert has_transformer_engine_layers(ours) and peer_has(peer_model)
    for key, value in original.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    x = torch.randn(3, 16)
    assert torch.equal(ours(x), original(x))
    convert_model(ours, to_transformer_engine=False)  # and back (Accelerate's way back is broken: nn.Linear has no params_dtype)
    assert _te_layers(ours, fake_te.te) == [] and torch.equal(ours(x), original(x))


def test_te_chosen_when_it_is_the_only_fp8_backend(fake_te, monkeypatch):
    import importlib.util

    from hasten import Accelerator
    from hasten.utils import FP8BackendType, TERecipeKwargs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("torchao") else real(name, *a))
    hasten.core.availability._installed.cache_clear()
    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    assert accelerator.fp8_backend is FP8BackendType.TE and isinstance(accelerator.te_recipe_handler, TERecipeKwargs)
    model, _ = accelerator.prepare(nn.Sequential(nn.Linear(16, 16)), torch.optim.SGD([torch.ones(1)], lr=0.1))
    assert type(model[0]) is fake_te.te.Linear


def test_refusals_in_one_sentence(fake_te, monkeypatch):
    from hasten import Accelerator
    from hasten.fp8.setup import Fp8Setup
    from hasten.utils import TERecipeKwargs

    recipe = TERecipeKwargs()
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[recipe])
    with pytest.raises(ValueError, match=r"prepares one model with its optimizer, and prepare got 1 model\(s\) and 0"):
        accelerator.prepare(nn.Linear(16, 16))
    with pytest.raises(ValueError, match="compute capability 8.9 or newer .* this one has 8.0"):
        Fp8Setup.resolve([recipe], "fp8", torch.device("cuda", 0), capability=(8, 0))
    monkeypatch.setattr(hasten.fp8.te, "TE_DEVICE_TYPES", ("cuda",))
    with pytest.raises(ValueError, match=r"runs on NVIDIA GPUs only, and this Accelerator's device is cpu; .*AORecipeKwargs"):
        Fp8Setup.resolve([recipe], "fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="MXFP8 support, which this GPU lacks"):
        hasten.fp8.te.apply_fp8_autowrap(nn.Linear(16, 16), TERecipeKwargs(use_mxfp8_block_scaling=True))


def test_without_transformer_engine_every_entry_refuses_naming_the_install(monkeypatch):
    import importlib.util

    from hasten import Accelerator
    from hasten.utils import TERecipeKwargs, apply_fp8_autowrap, convert_model, has_transformer_engine_layers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("transformer_engine") else real(name, *a))
    hasten.core.availability._installed.cache_clear()
    try:
        sentence = r"needs NVIDIA Transformer Engine, which is not installed; .*NVIDIA fp8 GPU \(pip install transformer_engine\[pytorch\]\)"
        with pytest.raises(ImportError, match="TERecipeKwargs " + sentence):
            TERecipeKwargs()
        for entry in (convert_model, has_transformer_engine_layers):
            with pytest.raises(ImportError, match=entry.__name__ + " " + sentence):
                entry(nn.Linear(16, 16))
        with pytest.raises(ImportError, match="apply_fp8_autowrap " + sentence):
            apply_fp8_autowrap(nn.Linear(16, 16), None)
        monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
        with pytest.raises(ImportError, match="TERecipeKwargs " + sentence):
            Accelerator(cpu=True, mixed_precision="fp8")
    finally:
        hasten.core.availability._installed.cache_clear()
