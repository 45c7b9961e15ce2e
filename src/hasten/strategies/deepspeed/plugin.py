"""`DeepSpeedPlugin`: DeepSpeed ZeRO settings with the peer's field names, and the JSON config they become.

The same settings come from three places, decoded here once: the plugin a
script passes to `Accelerator(deepspeed_plugin=...)`, the `deepspeed_config`
section of a launch config file and the `--zero_stage`/... launch flags (both
reach each process in the launch spec; see `hasten.launch.config.DeepSpeedConfig`).

A DeepSpeed JSON config may leave values as ``"auto"``; they are filled when
the model is prepared, from the Accelerator (accumulation steps, mixed
precision, number of processes) and the prepared objects (batch size,
`DummyOptim`/`DummyScheduler` hyperparameters). A value the file sets that
disagrees with the Accelerator is an error that names both, never a silent
override. DeepSpeed itself is imported only when a run uses it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ...core.errors import DeepSpeedConfigError
from .config import HfDeepSpeedConfig, auto_keys, contains_auto, require_deepspeed

__all__ = ["DeepSpeedPlugin"]


# plugin field -> where it lives in the DeepSpeed JSON config
_PLUGIN_TO_CONFIG = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}


def _engine_dtype(mixed_precision: str) -> str:
    """The DeepSpeed config's 16-bit section a precision turns on: fp8 trains on a bf16 engine (as in Accelerate),
    its fp8 matrix products being torchao's `Float8Linear` (or Transformer Engine's layers)."""
    return "bf16" if mixed_precision == "fp8" else mixed_precision


def _conflict(what: str, file_value: Any, ours: str, our_value: Any, fix: str) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(f"the DeepSpeed config sets {what}={file_value!r} but {ours} is {our_value!r}; {fix}.")


@dataclass
class DeepSpeedPlugin:
    """How DeepSpeed ZeRO runs: a JSON config (`hf_ds_config`) or the fields below, never a conflicting mix.

    With `hf_ds_config` (a path or a dict) the file decides and a field given
    here only fills the file's ``"auto"`` values; a field that contradicts the
    file is an error. Without it, the fields build the config (ZeRO stage 2 by
    default). `deepspeed_config` is the resulting dict.

    Example:
        >>> plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0)
        >>> plugin.deepspeed_config["zero_optimization"]["stage"], plugin.get_value("gradient_clipping")
        (3, 1.0)
        >>> DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}}).zero_stage
        1
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.enable_msamp:
            raise NotImplementedError("enable_msamp needs NVIDIA MS-AMP and GPUs, which hasten does not support; remove it.")
        if isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            pass
        elif self.hf_ds_config is not None and self.hf_ds_config != "none":
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
        else:
            self.hf_ds_config = None
        if self.hf_ds_config is not None:
            self._merge_into_file()
        else:
            self._build_config()
        self.deepspeed_config: dict[str, Any] = self.hf_ds_config.config
        self.deepspeed_config.setdefault("steps_per_print", 2**62)  # keeps DeepSpeed quiet on stdout
        if self.zero3_init_flag is None:
            self.zero3_init_flag = False
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            raise DeepSpeedConfigError(f"zero3_init_flag=True needs ZeRO stage 3 but the config has stage {self.zero_stage}; "
                                       "set zero_stage=3 or drop zero3_init_flag.")
        # Whether this plugin is the one models are prepared under now: the Accelerator selects its (first) plugin,
        # `AcceleratorState.select_deepspeed_plugin(name)` another of its named ones.
        self._selected = False

    def _build_config(self) -> None:
        stage = 2 if self.zero_stage is None else int(self.zero_stage)
        if stage not in (0, 1, 2, 3):
            raise DeepSpeedConfigError(f"zero_stage={stage!r} is not one of 0, 1, 2, 3; pick one of those.")
        self.zero_stage = stage
        self.offload_optimizer_device = self.offload_optimizer_device or "none"
        self.offload_param_device = self.offload_param_device or "none"
        if self.gradient_accumulation_steps is None:
            self.gradient_accumulation_steps = "auto"
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = False
        zero: dict[str, Any] = {
            "stage": stage,
            "offload_optimizer": {"device": self.offload_optimizer_device},
            "offload_param": {"device": self.offload_param_device},
            "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
        }
        if self.offload_optimizer_device == "nvme":
            zero["offload_optimizer"]["nvme_path"] = self.offload_optimizer_nvme_path
        if self.offload_param_device == "nvme":
            zero["offload_param"]["nvme_path"] = self.offload_param_nvme_path
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": zero,
        }
        if self.gradient_clipping not in (None, "auto"):
            config["gradient_clipping"] = float(self.gradient_clipping)
        self.hf_ds_config = HfDeepSpeedConfig(config)

    def _merge_into_file(self) -> None:
        """Fields given here fill the file's "auto" values; one that contradicts the file is an error."""
        config = self.hf_ds_config
        if "zero_optimization" not in config.config:
            raise DeepSpeedConfigError("the DeepSpeed config has no zero_optimization section; add one, "
                                       'e.g. "zero_optimization": {"stage": 2}.')
        for name, key in _PLUGIN_TO_CONFIG.items():
            ours = getattr(self, name)
            if ours is None or ours == "auto":
                continue
            theirs = config.get_value(key)
            if theirs is None or theirs == "auto":
                config.set_value(key, ours)
            elif theirs != ours and not (isinstance(theirs, (int, float)) and float(theirs) == float(ours)):
                raise _conflict(key, theirs, f"DeepSpeedPlugin({name}=...)", ours,
                                f"remove {name} from the plugin or change the file so they agree")
        if config.get_value("gradient_accumulation_steps") is None:
            config.set_value("gradient_accumulation_steps", "auto")
        for name, key in _PLUGIN_TO_CONFIG.items():  # the plugin's fields report what the file says
            value = config.get_value(key)
            if value is not None and value != "auto":
                setattr(self, name, value)
        if self.zero_stage is None:
            self.zero_stage = config.zero_stage()

    # -- the peer's accessors -------------------------------------------------------------
    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """A value of the config by dotted key, e.g. ``plugin.get_value("zero_optimization.stage")``."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        return self.hf_ds_config.is_auto(ds_key_long)

    def fill_match(self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any) -> None:
        """Fill `ds_key_long` from `kwargs` when it is "auto"; with `must_match`, record a disagreeing value."""
        value = self.get_value(ds_key_long)
        if ds_key_long not in kwargs:
            return
        wanted = kwargs[ds_key_long]
        if value is None or value == "auto":
            self.hf_ds_config.set_value(ds_key_long, wanted)
        elif must_match and value != wanted and mismatches is not None:
            mismatches.append(f"- ds {ds_key_long}={value} vs hasten {wanted}")

    def deepspeed_config_process(self, prefix: str = "", mismatches: list[str] | None = None, config: Any = None,
                                 must_match: bool = True, **kwargs: Any) -> None:
        """Fill every "auto" value named in `kwargs` (dotted keys); raise once listing the mismatches."""
        own = mismatches is None
        mismatches = [] if own else mismatches
        for key in kwargs:
            self.fill_match(key, mismatches, must_match=must_match, **kwargs)
        if own and mismatches:
            raise DeepSpeedConfigError("the DeepSpeed config disagrees with the Accelerator: " + "; ".join(mismatches)
                                       + "; make them agree or set the values to 'auto'.")

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Any:
        """Inside, models are built directly partitioned (`deepspeed.zero.Init`) when `zero3_init_flag` is set.

        Example:
            >>> import torch
            >>> with DeepSpeedPlugin(zero_stage=2).zero3_init_context_manager():
            ...     layer = torch.nn.Linear(2, 2)
        """
        if not (enable or self.zero3_init_flag) or not self.hf_ds_config.is_zero3():
            yield
            return
        deepspeed = require_deepspeed()
        config = {k: v for k, v in self.deepspeed_config.items() if not contains_auto(v)}
        with deepspeed.zero.Init(config_dict_or_path=config):
            yield

    # -- which of several named plugins is active -------------------------------------------------
    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this the plugin models are prepared under; only `AcceleratorState` does it (as in Accelerate).

        Example:
            >>> DeepSpeedPlugin().select()
            Traceback (most recent call last):
            ...
            ValueError: a DeepSpeedPlugin is selected by the Accelerator (its first plugin) or by accelerator.state.select_deepspeed_plugin(name), not by calling select() on it.
        """
        if not _from_accelerator_state:
            raise ValueError("a DeepSpeedPlugin is selected by the Accelerator (its first plugin) or by "
                             "accelerator.state.select_deepspeed_plugin(name), not by calling select() on it.")
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @property
    def selected(self) -> bool:
        """True for the plugin the next model is prepared under (of an Accelerator's named plugins, one at a time).

        Example:
            >>> DeepSpeedPlugin().selected
            False
        """
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        raise NotImplementedError("DeepSpeedPlugin.selected is set by accelerator.state.select_deepspeed_plugin(name); "
                                  "call that instead of assigning it.")

    # -- checks against the Accelerator --------------------------------------------------------
    def check_mixed_precision(self, mixed_precision: str) -> None:
        """Raise if the config's fp16/bf16 sections disagree with the Accelerator's `mixed_precision`.

        Example:
            >>> DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}).check_mixed_precision("no")
            Traceback (most recent call last):
            ...
            hasten.core.errors.DeepSpeedConfigError: the DeepSpeed config sets bf16.enabled=True but the Accelerator's mixed_precision is 'no'; pass mixed_precision='bf16' (or --mixed_precision bf16) or set "bf16": {"enabled": "auto"} in the file.
        """
        engine_dtype = _engine_dtype(mixed_precision)
        for dtype in ("fp16", "bf16"):
            enabled = self.get_value(f"{dtype}.enabled")
            if enabled is None or enabled == "auto":
                continue
            flag = str(enabled).lower() == "true"
            if flag != (engine_dtype == dtype):
                auto = f'set "{dtype}": {{"enabled": "auto"}} in the file'
                fix = (f"pass mixed_precision='{dtype}' (or --mixed_precision {dtype}) or {auto}" if flag
                       else f"{auto} or pass a mixed_precision other than '{mixed_precision}'")
                raise _conflict(f"{dtype}.enabled", enabled, "the Accelerator's mixed_precision", mixed_precision, fix)

    def resolve_accumulation(self, accelerator_steps: int, given: bool = True) -> int:
        """The accumulation steps both sides use; `given`: the script or launcher set the Accelerator's explicitly.

        A number the DeepSpeed config sets must equal one given to the
        Accelerator; when none was given, the config's number is used.

        Example:
            >>> DeepSpeedPlugin(gradient_accumulation_steps=4).resolve_accumulation(1, given=False)
            4
            >>> DeepSpeedPlugin().resolve_accumulation(2)
            2
        """
        value = self.get_value("gradient_accumulation_steps")
        if value is None or value == "auto":
            steps = accelerator_steps
        else:
            steps = int(value)
            if given and steps != accelerator_steps:
                raise _conflict("gradient_accumulation_steps", steps, "the Accelerator's gradient_accumulation_steps",
                                accelerator_steps, "give the same number in both places, or set it to \"auto\" in the DeepSpeed config")
        self.hf_ds_config.set_value("gradient_accumulation_steps", steps)
        self.gradient_accumulation_steps = steps
        return steps

    def build_engine_config(self, *, world_size: int, mixed_precision: str, device_type: str,
                            micro_batch_size: int | None, client_optimizer: bool | None, optimizer: Any = None,
                            scheduler: Any = None) -> dict[str, Any]:
        """The config `deepspeed.initialize` gets: every "auto" filled, every disagreement raised.

        `client_optimizer`: True for a torch optimizer, False for a `DummyOptim`
        (the config's optimizer), None for a model prepared without one (an
        engine that only runs forward, e.g. a frozen teacher under ZeRO-3).

        Example:
            >>> plugin = DeepSpeedPlugin(zero_stage=1, gradient_accumulation_steps=2)
            >>> config = plugin.build_engine_config(world_size=2, mixed_precision="bf16", device_type="cpu",
            ...                                     micro_batch_size=8, client_optimizer=True)
            >>> config["train_batch_size"], config["bf16"]["enabled"], config["gradient_accumulation_steps"]
            (32, True, 2)
        """
        self.check_mixed_precision(mixed_precision)
        config = HfDeepSpeedConfig(self.deepspeed_config)
        gas = config.get_value("gradient_accumulation_steps")
        if gas in (None, "auto"):
            raise DeepSpeedConfigError("gradient_accumulation_steps is still 'auto'; call resolve_accumulation first.")
        gas = int(gas)
        for dtype in ("fp16", "bf16"):
            config.set_value(f"{dtype}.enabled", _engine_dtype(mixed_precision) == dtype)
        self._fill_batch_sizes(config, world_size, gas, micro_batch_size)
        if config.is_auto("gradient_clipping"):
            clip = self.gradient_clipping
            config.set_value("gradient_clipping", float(clip) if clip not in (None, "auto") else 1.0)
        if config.is_auto("zero_optimization.stage3_gather_16bit_weights_on_model_save"):
            config.set_value("zero_optimization.stage3_gather_16bit_weights_on_model_save", bool(self.zero3_save_16bit_model))
        has_optimizer = "optimizer" in config.config
        if client_optimizer is None:  # forward only: no optimizer and no scheduler for DeepSpeed to build
            if has_optimizer:
                raise DeepSpeedConfigError("prepare got a model without an optimizer, but this DeepSpeed config defines "
                                           "one, which nothing would step; pass DummyOptim(model.parameters()) with the "
                                           "model, or use a config without \"optimizer\" for a forward-only engine.")
            config.config.pop("scheduler", None)
            return self._finish(config)
        if client_optimizer and has_optimizer:
            raise DeepSpeedConfigError("the DeepSpeed config defines an optimizer and the code passed a torch optimizer too; "
                                       "remove \"optimizer\" from the config or pass hasten.utils.DummyOptim to prepare.")
        if not client_optimizer and not has_optimizer:
            raise DeepSpeedConfigError("prepare got a DummyOptim but the DeepSpeed config defines no optimizer; "
                                       "add an \"optimizer\" section to the config or pass a torch optimizer.")
        if client_optimizer:
            config.config.setdefault("zero_allow_untested_optimizer", True)
        else:
            self._fill_optimizer(config, optimizer, device_type)
        self._fill_scheduler(config, scheduler)
        return self._finish(config)

    @staticmethod
    def _finish(config: HfDeepSpeedConfig) -> dict[str, Any]:
        leftover = auto_keys(config.config)
        if leftover:
            raise DeepSpeedConfigError(f"the DeepSpeed config still has 'auto' for {', '.join(leftover)}, which hasten "
                                       "cannot fill from the Accelerator; give explicit values in the file.")
        return config.config

    def _fill_batch_sizes(self, config: HfDeepSpeedConfig, world_size: int, gas: int, micro: int | None) -> None:
        file_micro = config.get_value("train_micro_batch_size_per_gpu")
        if file_micro in (None, "auto"):
            file_micro = None
        elif micro is not None and int(file_micro) != micro:
            raise _conflict("train_micro_batch_size_per_gpu", file_micro, "the prepared DataLoader's per-process batch size",
                            micro, "set it to \"auto\" in the DeepSpeed config or give the DataLoader that batch size")
        # DeepSpeed only logs and counts samples with it; the training math does not depend on it.
        micro = micro if micro is not None else (int(file_micro) if file_micro is not None else 1)
        config.set_value("train_micro_batch_size_per_gpu", micro)
        total = micro * gas * world_size
        file_total = config.get_value("train_batch_size")
        if file_total not in (None, "auto") and int(file_total) != total:
            raise _conflict("train_batch_size", file_total, "micro batch x accumulation steps x processes",
                            f"{micro} x {gas} x {world_size} = {total}", "set train_batch_size to \"auto\" in the DeepSpeed config")
        config.set_value("train_batch_size", total)

    def _fill_optimizer(self, config: HfDeepSpeedConfig, optimizer: Any, device_type: str) -> None:
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

    def _fill_scheduler(self, config: HfDeepSpeedConfig, scheduler: Any) -> None:
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

    @classmethod
    def from_launch_config(cls, section: dict[str, Any]) -> "DeepSpeedPlugin":
        """Build from a `deepspeed_config` section (config file or launch flags, as `hasten.launch.config.DeepSpeedConfig` holds it).

        With a `deepspeed_config_file` the file decides: the section's other
        ZeRO fields are the launcher's defaults and are not applied over it.
        An accumulation of 1 (the launcher's default) means "auto": the
        Accelerator's own value is used.

        Example:
            >>> plugin = DeepSpeedPlugin.from_launch_config({"zero_stage": 3, "gradient_clipping": 1.0})
            >>> plugin.zero_stage, plugin.get_value("gradient_accumulation_steps")
            (3, 'auto')
        """
        get = section.get
        file = get("deepspeed_config_file")
        moe = get("deepspeed_moe_layer_cls_names")
        if file:
            return cls(hf_ds_config=file, zero3_init_flag=bool(get("zero3_init_flag", False)), transformer_moe_cls_names=moe)
        steps = get("gradient_accumulation_steps")
        return cls(
            gradient_accumulation_steps=None if steps in (None, 1) else int(steps),
            gradient_clipping=get("gradient_clipping"),
            zero_stage=int(get("zero_stage", 2)),
            offload_optimizer_device=get("offload_optimizer_device", "none"),
            offload_param_device=get("offload_param_device", "none"),
            offload_optimizer_nvme_path=get("offload_optimizer_nvme_path"),
            offload_param_nvme_path=get("offload_param_nvme_path"),
            zero3_init_flag=bool(get("zero3_init_flag", False)),
            zero3_save_16bit_model=bool(get("zero3_save_16bit_model", False)),
            transformer_moe_cls_names=moe,
        )
