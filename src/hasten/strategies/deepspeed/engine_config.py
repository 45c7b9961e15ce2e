"""The config `deepspeed.initialize` gets: a plugin's config with every "auto" filled, every disagreement raised.

The plugin keeps the user's config ("auto" values and all, as libraries
read it); `engine_config` returns a filled copy for one engine, from the
Accelerator (processes, precision, accumulation) and the prepared objects
(batch size, `DummyOptim` / `DummyScheduler` hyperparameters).

Example:
    >>> from hasten.strategies.deepspeed.plugin import DeepSpeedPlugin
    >>> plugin = DeepSpeedPlugin(zero_stage=1, gradient_accumulation_steps=2)
    >>> config = engine_config(plugin, world_size=2, mixed_precision="bf16", device_type="cpu",
    ...                        micro_batch_size=8, client_optimizer=True)
    >>> config["train_batch_size"], config["bf16"]["enabled"], config["gradient_clipping"]
    (32, True, 1.0)
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ...core.errors import DeepSpeedConfigError
from .config import HfDeepSpeedConfig, auto_keys

__all__ = ["engine_config", "engine_dtype", "conflict", "ElasticBatch", "recipe_accumulation"]


class PluginView(Protocol):
    """What the filling reads of a `DeepSpeedPlugin` (a protocol, so this module need not import the plugin's)."""

    deepspeed_config: dict[str, Any]
    gradient_clipping: Any
    zero3_save_16bit_model: Any

    def check_mixed_precision(self, mixed_precision: str) -> None: ...

    def resolve_accumulation(self, accelerator_steps: int, given: bool = True) -> int: ...


class ElasticBatch(NamedTuple):
    """An elastic run's batch for one engine: the engine's accumulation at this size (the most micro-batches a
    process takes in a step: a filler pass makes up one fewer), and the recipe at MAX processes that the config's
    own numbers must describe."""

    engine_accumulation: int
    recipe_accumulation: int
    max_processes: int


def recipe_accumulation(plugin: PluginView, accelerator_steps: int, given: bool, max_processes: int) -> int:
    """An elastic run's accumulation at MAX processes where the DeepSpeed config decides it: its
    ``gradient_accumulation_steps``, else ``train_batch_size / (train_micro_batch_size_per_gpu x MAX)``, else the
    Accelerator's (`accelerator_steps`; `given`: set explicitly, which a number in the config must equal).

    Example:
        >>> from hasten.strategies.deepspeed.plugin import DeepSpeedPlugin
        >>> plugin = DeepSpeedPlugin(hf_ds_config={"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4,
        ...                                        "zero_optimization": {"stage": 2}})
        >>> recipe_accumulation(plugin, 1, given=False, max_processes=2)
        3
    """
    config = HfDeepSpeedConfig(plugin.deepspeed_config)
    gas, total = config.get_value("gradient_accumulation_steps"), config.get_value("train_batch_size")
    if getattr(plugin, "_accumulation_implied", False):  # the 1 written for a file that gave none
        gas = None
    if given or gas not in (None, "auto") or total in (None, "auto"):
        return plugin.resolve_accumulation(accelerator_steps, given=given)
    micro = config.get_value("train_micro_batch_size_per_gpu")
    if micro in (None, "auto") or int(total) % (int(micro) * max_processes):
        raise DeepSpeedConfigError(
            f"the DeepSpeed config sets train_batch_size={total} for this elastic run without a gradient_accumulation_"
            f"steps it can be read from at {max_processes} processes (train_micro_batch_size_per_gpu={micro!r}); set "
            "gradient_accumulation_steps in the config (or give it to the Accelerator) and train_batch_size to "
            "\"auto\".")
    return plugin.resolve_accumulation(int(total) // (int(micro) * max_processes), given=True)


def engine_dtype(mixed_precision: str) -> str:
    """The DeepSpeed config's 16-bit section a precision turns on: fp8 trains on a bf16 engine (as in Accelerate),
    its fp8 matrix products being torchao's `Float8Linear` (or Transformer Engine's layers).

    Example:
        >>> engine_dtype("fp8"), engine_dtype("fp16")
        ('bf16', 'fp16')
    """
    return "bf16" if mixed_precision == "fp8" else mixed_precision


def conflict(what: str, file_value: Any, ours: str, our_value: Any, fix: str) -> DeepSpeedConfigError:
    """The one-sentence error for a config value that disagrees with a setting elsewhere.

    Example:
        >>> print(conflict("zero_optimization.stage", 3, "DeepSpeedPlugin(zero_stage=...)", 2, "make them agree"))
        the DeepSpeed config sets zero_optimization.stage=3 but DeepSpeedPlugin(zero_stage=...) is 2; make them agree.
    """
    return DeepSpeedConfigError(f"the DeepSpeed config sets {what}={file_value!r} but {ours} is {our_value!r}; {fix}.")


def engine_config(plugin: PluginView, *, world_size: int, mixed_precision: str, device_type: str,
                  micro_batch_size: int | None, client_optimizer: bool | None, optimizer: Any = None,
                  scheduler: Any = None, elastic: ElasticBatch | None = None) -> dict[str, Any]:
    """`plugin`'s config filled for one engine (see `DeepSpeedPlugin.build_engine_config`).

    Example:
        >>> from hasten.strategies.deepspeed.plugin import DeepSpeedPlugin
        >>> engine_config(DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=1), world_size=1,
        ...               mixed_precision="no", device_type="cpu", micro_batch_size=2, client_optimizer=None)["train_batch_size"]
        2
    """
    plugin.check_mixed_precision(mixed_precision)
    config = HfDeepSpeedConfig(plugin.deepspeed_config)
    gas = config.get_value("gradient_accumulation_steps")
    if gas in (None, "auto"):
        raise DeepSpeedConfigError("gradient_accumulation_steps is still 'auto'; call resolve_accumulation first.")
    gas = int(gas)
    for dtype in ("fp16", "bf16"):
        config.set_value(f"{dtype}.enabled", engine_dtype(mixed_precision) == dtype)
    _fill_batch_sizes(config, world_size, gas, micro_batch_size, elastic)
    if config.is_auto("gradient_clipping"):
        clip = plugin.gradient_clipping
        config.set_value("gradient_clipping", float(clip) if clip not in (None, "auto") else 1.0)
    if config.is_auto("zero_optimization.stage3_gather_16bit_weights_on_model_save"):
        config.set_value("zero_optimization.stage3_gather_16bit_weights_on_model_save", bool(plugin.zero3_save_16bit_model))
    has_optimizer = "optimizer" in config.config
    if client_optimizer is None:  # forward only: no optimizer and no scheduler for DeepSpeed to build
        if has_optimizer:
            raise DeepSpeedConfigError("prepare got a model without an optimizer, but this DeepSpeed config defines "
                                       "one, which nothing would step; pass DummyOptim(model.parameters()) with the "
                                       "model, or use a config without \"optimizer\" for a forward-only engine.")
        config.config.pop("scheduler", None)
        return _finish(config)
    if client_optimizer and has_optimizer:
        raise DeepSpeedConfigError("the DeepSpeed config defines an optimizer and the code passed a torch optimizer too; "
                                   "remove \"optimizer\" from the config or pass hasten.utils.DummyOptim to prepare.")
    if not client_optimizer and not has_optimizer:
        raise DeepSpeedConfigError("prepare got a DummyOptim but the DeepSpeed config defines no optimizer; "
                                   "add an \"optimizer\" section to the config or pass a torch optimizer.")
    if client_optimizer:
        config.config.setdefault("zero_allow_untested_optimizer", True)
    else:
        _fill_optimizer(config, optimizer, device_type)
    _fill_scheduler(config, scheduler)
    return _finish(config)


def _finish(config: HfDeepSpeedConfig) -> dict[str, Any]:
    leftover = auto_keys(config.config)
    if leftover:
        raise DeepSpeedConfigError(f"the DeepSpeed config still has 'auto' for {', '.join(leftover)}, which hasten "
                                   "cannot fill from the Accelerator; give explicit values in the file.")
    return config.config


def _fill_batch_sizes(config: HfDeepSpeedConfig, world_size: int, gas: int, micro: int | None,
                      elastic: ElasticBatch | None = None) -> None:
    file_micro = config.get_value("train_micro_batch_size_per_gpu")
    if file_micro in (None, "auto"):
        file_micro = None
    elif micro is not None and int(file_micro) != micro:
        raise conflict("train_micro_batch_size_per_gpu", file_micro, "the prepared DataLoader's per-process batch size",
                       micro, "set it to \"auto\" in the DeepSpeed config or give the DataLoader that batch size")
    # DeepSpeed only logs and counts samples with it; the training math does not depend on it.
    micro = micro if micro is not None else (int(file_micro) if file_micro is not None else 1)
    config.set_value("train_micro_batch_size_per_gpu", micro)
    # the config's numbers describe the recipe: at MAX processes in an elastic run
    recipe_gas, recipe_world = (elastic.recipe_accumulation, elastic.max_processes) if elastic else (gas, world_size)
    total = micro * recipe_gas * recipe_world
    file_total = config.get_value("train_batch_size")
    if file_total not in (None, "auto") and int(file_total) != total:
        raise conflict("train_batch_size", file_total, "micro batch x accumulation steps x processes",
                       f"{micro} x {recipe_gas} x {recipe_world} = {total}",
                       "set train_batch_size to \"auto\" in the DeepSpeed config")
    if elastic is not None:  # the engine's own view at this size (its boundaries are set step by step)
        config.set_value("gradient_accumulation_steps", elastic.engine_accumulation)
        total = micro * elastic.engine_accumulation * world_size
    config.set_value("train_batch_size", total)


def _fill_optimizer(config: HfDeepSpeedConfig, optimizer: Any, device_type: str) -> None:
    params = config.config["optimizer"].setdefault("params", {})
    values = {"lr": getattr(optimizer, "lr", None), "weight_decay": getattr(optimizer, "weight_decay", None)}
    values.update(getattr(optimizer, "kwargs", {}) or {})
    for key, value in list(params.items()):
        if value == "auto":
            if values.get(key) is None:
                raise DeepSpeedConfigError(f"the DeepSpeed config has optimizer.params.{key}='auto' but the DummyOptim "
                                           f"gives no {key}; pass DummyOptim(..., {key}=...) or a value in the file.")
            value = values[key]
            params[key] = list(value) if isinstance(value, tuple) else value
    kind = str(config.config["optimizer"].get("type", "")).lower()
    if device_type == "cpu" and kind in ("adam", "adamw") and "torch_adam" not in params:
        params["torch_adam"] = True  # DeepSpeed's fused Adam needs a GPU


def _fill_scheduler(config: HfDeepSpeedConfig, scheduler: Any) -> None:
    section = config.config.get("scheduler")
    if section is None:
        return
    params = section.setdefault("params", {})
    lr = config.get_value("optimizer.params.lr")
    values = {"warmup_min_lr": 0, "warmup_max_lr": lr, "cos_min_ratio": 0.0,
              "warmup_num_steps": getattr(scheduler, "warmup_num_steps", None),
              "total_num_steps": getattr(scheduler, "total_num_steps", None)}
    for key, value in list(params.items()):
        if value == "auto":
            if values.get(key) is None:
                raise DeepSpeedConfigError(f"the DeepSpeed config has scheduler.params.{key}='auto' and nothing fills it; "
                                           f"pass DummyScheduler(..., {key}=...) or give a value in the file.")
            params[key] = values[key]
