"""`DeepSpeedPlugin`: DeepSpeed ZeRO settings with the peer's field names, and the JSON config they become.

The same settings come from four places, decoded here once: the plugin a
script passes to `Accelerator(deepspeed_plugin=...)`, whose fields left as
None are read from the ``ACCELERATE_DEEPSPEED_*`` / ``ACCELERATE_GRADIENT_*``
variables as Accelerate's are (what `hasten launch --use_deepspeed` and
`accelerate launch` export), the `deepspeed_config` section of a launch
config file and the `--zero_stage`/... launch flags (both reach each
process in the launch spec; see `hasten.launch.config.DeepSpeedConfig`).

A DeepSpeed JSON config may leave values as ``"auto"``. The Accelerator
fills the fp16/bf16 sections when it is created (`set_mixed_precision`, as
Accelerate's does, so libraries read them before `prepare`); the rest is
filled for each engine at `prepare` (`engine_config.py`), from the
Accelerator (accumulation steps, number of processes) and the prepared
objects (batch size, `DummyOptim`/`DummyScheduler` hyperparameters). A value
given to the plugin that disagrees with the file is an error that names
both, never a silent override. Selecting a plugin tells transformers about
its config (`set_deepspeed_weakref`). DeepSpeed itself is imported only
when a run uses it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ...core.environment import str_to_bool
from ...core.errors import DeepSpeedConfigError
from .config import HfDeepSpeedConfig, require_deepspeed, tell_transformers
from .engine_config import ElasticBatch, conflict, engine_config, engine_dtype
from .environment import check_launcher_fields, read_environment

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
@dataclass
class DeepSpeedPlugin:
    """How DeepSpeed ZeRO runs: a JSON config (`hf_ds_config`) or the fields below, never a conflicting mix.

    Fields left as None are read from the launcher's variables
    (``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``ACCELERATE_GRADIENT_CLIPPING``, ...,
    ``ACCELERATE_DEEPSPEED_CONFIG_FILE``), else take Accelerate's defaults
    (ZeRO stage 2, no offload, "auto" accumulation and clipping). With
    `hf_ds_config` (a path or a dict) the file decides: a field given here
    only fills the file's ``"auto"`` values, and one that contradicts the
    file is an error. `deepspeed_config` is the resulting dict.
    `zero3_init_flag` defaults to whether the config is ZeRO-3 (and is
    turned off, with a warning, for another stage).

    Example:
        >>> plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0)
        >>> plugin.deepspeed_config["zero_optimization"]["stage"], plugin.get_value("gradient_clipping"), plugin.zero3_init_flag
        (3, 1.0, True)
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

    def __post_init__(self) -> None:
        given = {name for name in _PLUGIN_TO_CONFIG if getattr(self, name) is not None}
        self._accumulation_implied = False  # the file gave no gradient_accumulation_steps (1 written for it)
        read_environment(self, os.environ)
        if isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            pass
        elif self.hf_ds_config is not None and self.hf_ds_config != "none":
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
        else:
            self.hf_ds_config = None
        if self.hf_ds_config is not None:
            check_launcher_fields(os.environ)
            self._merge_into_file(given)
        else:
            self._build_config()
        self.deepspeed_config: dict[str, Any] = self.hf_ds_config.config
        self.deepspeed_config.setdefault("steps_per_print", 2**62)  # keeps DeepSpeed quiet on stdout
        if self.zero3_init_flag is None:
            flag = os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT", str(self.hf_ds_config.is_zero3()))
            self.zero3_init_flag = bool(str_to_bool(flag, to_bool=True))
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn(f"zero3_init_flag only applies to ZeRO stage 3 and this config has stage {self.zero_stage}; "
                          "it is set to False.", stacklevel=3)
            self.zero3_init_flag = False
        # Whether this plugin is the one models are prepared under now: the Accelerator selects its (first) plugin,
        # `AcceleratorState.select_deepspeed_plugin(name)` another of its named ones.
        self._selected = False
        self.dschf: Any = None  # what transformers' weak reference points at (`set_deepspeed_weakref`)

    def _build_config(self) -> None:
        stage = self.zero_stage
        if str(stage) not in ("0", "1", "2", "3"):
            raise DeepSpeedConfigError(f"zero_stage={stage!r} is not one of 0, 1, 2, 3; pick one of those.")
        stage = int(stage)  # type: ignore[arg-type]
        self.zero_stage = stage

        def offload(device: str | None, path: str | None) -> dict[str, Any]:
            return {"device": device, "nvme_path": path if device == "nvme" else None}

        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": stage,
                "offload_optimizer": offload(self.offload_optimizer_device, self.offload_optimizer_nvme_path),
                "offload_param": offload(self.offload_param_device, self.offload_param_nvme_path),
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping is not None:  # "auto" too (filled at prepare, 1.0); 0.0 is written, as in 1.16
            config["gradient_clipping"] = self.gradient_clipping
        self.hf_ds_config = HfDeepSpeedConfig(config)

    def _merge_into_file(self, given: set[str]) -> None:
        """Fields fill the file's "auto" values; one given here that contradicts the file is an error."""
        config = self.hf_ds_config
        if "zero_optimization" not in config.config:
            raise DeepSpeedConfigError("the DeepSpeed config has no zero_optimization section; add one, "
                                       'e.g. "zero_optimization": {"stage": 2}.')
        for name, key in _PLUGIN_TO_CONFIG.items():
            ours = getattr(self, name)
            if ours is None or ours == "auto":
                continue
            theirs = config.get_value(key)
            if name not in given:  # a launcher variable or Accelerate's default: it fills "auto" only, as there
                if theirs == "auto":
                    config.set_value(key, ours)
            elif theirs is None or theirs == "auto":
                config.set_value(key, ours)
            elif theirs != ours and not (isinstance(theirs, (int, float)) and float(theirs) == float(ours)):
                raise conflict(key, theirs, f"DeepSpeedPlugin({name}=...)", ours,
                               f"remove {name} from the plugin or change the file so they agree")
        if config.get_value("gradient_accumulation_steps") is None:  # Accelerate's 1; an Accelerator's own number
            config.set_value("gradient_accumulation_steps", 1)       # still wins over it (`resolve_accumulation`)
            self._accumulation_implied = True
        for name, key in _PLUGIN_TO_CONFIG.items():  # the plugin's fields report what the file says
            value = config.get_value(key)
            if value is not None and value != "auto":
                setattr(self, name, value)
        if config.get_value("zero_optimization.stage") is None:  # DeepSpeed's default then, not the field's
            self.zero_stage = config.zero_stage()

    # -- the peer's accessors -------------------------------------------------------------
    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """A value of the config by dotted key.

        Example:
            >>> DeepSpeedPlugin(zero_stage=1).get_value("zero_optimization.stage")
            1
        """
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """True when the config sets `ds_key_long` to "auto".

        Example:
            >>> DeepSpeedPlugin().is_auto("train_micro_batch_size_per_gpu")
            True
        """
        return self.hf_ds_config.is_auto(ds_key_long)

    def fill_match(self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any) -> None:
        """Fill `ds_key_long` from `kwargs` when the config has "auto" there (an "auto" that `kwargs` lacks is an
        error); with `must_match`, append to `mismatches` a set value that disagrees with `kwargs`.

        Example:
            >>> plugin = DeepSpeedPlugin()
            >>> plugin.fill_match("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu=4)
            >>> plugin.get_value("train_micro_batch_size_per_gpu")
            4
        """
        mismatches = [] if mismatches is None else mismatches
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(key) == "auto":
            if ds_key_long not in kwargs:
                raise ValueError(f"`{ds_key_long}` not found in kwargs: the DeepSpeed config leaves it \"auto\"; set it "
                                 "in the config file or pass it in kwargs.")
            node[key] = kwargs[ds_key_long]
            return
        if must_match and node.get(key) is not None and ds_key_long in kwargs and node[key] != kwargs[ds_key_long]:
            mismatches.append(f"- ds {ds_key_long}={node[key]} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    def deepspeed_config_process(self, prefix: str = "", mismatches: list[str] | None = None, config: Any = None,
                                 must_match: bool = True, **kwargs: Any) -> None:
        """Fill every "auto" value of the config from `kwargs` (dotted keys); raise once listing the mismatches.

        Example:
            >>> plugin = DeepSpeedPlugin(gradient_accumulation_steps=1, gradient_clipping=1.0)
            >>> plugin.deepspeed_config_process(train_batch_size=8, train_micro_batch_size_per_gpu=8, gradient_clipping=1.0)
            >>> plugin.get_value("train_batch_size")
            8
        """
        mismatches = [] if mismatches is None else mismatches
        for key, value in (self.deepspeed_config if config is None else config).items():
            if isinstance(value, dict):
                self.deepspeed_config_process(prefix=f"{prefix}{key}.", mismatches=mismatches, config=value,
                                              must_match=must_match, **kwargs)
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if mismatches and prefix == "":
            raise ValueError("the DeepSpeed config disagrees with the values given: " + "; ".join(m.lstrip("- ") for m in mismatches)
                             + "; make them agree, or set these config values to 'auto'.")

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Fill the config's fp16/bf16 sections for `mixed_precision`, as Accelerate's Accelerator does when created.

        "fp16" adds ``{"enabled": True, "auto_cast": True}`` and "bf16"/"fp8"
        ``{"enabled": True}`` where the config has no section; the other
        section gets ``{"enabled": False}``; "auto" values are filled. A config
        that enables the other 16-bit type is refused.

        Example:
            >>> plugin = DeepSpeedPlugin()
            >>> plugin.set_mixed_precision("bf16"); plugin.deepspeed_config["bf16"], plugin.deepspeed_config["fp16"]
            ({'enabled': True}, {'enabled': False})
        """
        config = self.deepspeed_config
        if mixed_precision == "fp16" and "fp16" not in config:
            config["fp16"] = {"enabled": True, "auto_cast": True}
        elif mixed_precision in ("bf16", "fp8") and "bf16" not in config:
            config["bf16"] = {"enabled": True}
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(config.get(other, {}).get("enabled", "False")).lower() == "true":
                raise ValueError(f"mixed_precision={mixed_precision!r} cannot run with a DeepSpeed config that enables "
                                 f"{other}; pass mixed_precision='{other}' or disable {other} in the config.")
        for dtype in ("fp16", "bf16"):
            config.setdefault(dtype, {"enabled": False})
        wanted: dict[str, Any] = {"fp16.enabled": mixed_precision == "fp16",
                                  "bf16.enabled": engine_dtype(mixed_precision) == "bf16"}
        self.fill_match("fp16.enabled", must_match=False, **wanted)
        self.fill_match("bf16.enabled", must_match=False, **wanted)
        if self._selected:  # transformers was told about the config before its precision was known
            self.set_deepspeed_weakref()

    def set_deepspeed_weakref(self) -> None:
        """Tell transformers about this config (its `HfDeepSpeedConfig` weak reference), as Accelerate does.

        Afterwards transformers' `is_deepspeed_zero3_enabled()` is true under
        ZeRO-3 (so `from_pretrained` builds models partitioned) and
        `deepspeed_config()` returns this config, with "auto" accumulation and
        micro batch read as 1. Without transformers installed there is no one
        to tell. The object is kept alive in `dschf`.

        Example:
            >>> plugin = DeepSpeedPlugin(zero_stage=3)
            >>> plugin.set_deepspeed_weakref()
            >>> from transformers.integrations import is_deepspeed_zero3_enabled
            >>> is_deepspeed_zero3_enabled()
            True
        """
        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, "auto") == "auto":
                config[key] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        self.dschf = tell_transformers(config)

    def is_zero3_init_enabled(self) -> bool:
        """`zero3_init_flag`: whether models are meant to be built directly partitioned (ZeRO-3).

        Example:
            >>> DeepSpeedPlugin(zero_stage=2).is_zero3_init_enabled()
            False
        """
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Inside, `zero3_init_flag` is `enable` (and transformers is told again); restored on leaving.

        Example:
            >>> plugin = DeepSpeedPlugin(zero_stage=3)
            >>> with plugin.zero3_init_context_manager(enable=False):
            ...     plugin.zero3_init_flag
            False
            >>> plugin.zero3_init_flag
            True
        """
        old = self.zero3_init_flag
        if old == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = old
            self.dschf = None
            self.set_deepspeed_weakref()

    def set_moe_leaf_modules(self, model: Any) -> None:
        """Make the MoE layers named in `transformer_moe_cls_names` (else ``ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES``,
        comma-separated class names) ZeRO-3 leaf modules, gathered whole (`deepspeed.utils.set_z3_leaf_modules`).

        Example:
            >>> from torch import nn
            >>> DeepSpeedPlugin(transformer_moe_cls_names="Bilinear").set_moe_leaf_modules(nn.Linear(2, 2))
            Traceback (most recent call last):
            ...
            ValueError: transformer_moe_cls_names names Bilinear, which the model does not contain; name its MoE layer classes (e.g. MixtralSparseMoeBlock).
        """
        if self.transformer_moe_cls_names is None:
            self.transformer_moe_cls_names = os.environ.get("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES")
        if self.transformer_moe_cls_names is None:
            return
        from ...runtime.modules import get_module_class_from_name

        classes = []
        for name in self.transformer_moe_cls_names.split(","):
            found = get_module_class_from_name(model, name)
            if found is None:
                raise ValueError(f"transformer_moe_cls_names names {name}, which the model does not contain; name its "
                                 "MoE layer classes (e.g. MixtralSparseMoeBlock).")
            classes.append(found)
        require_deepspeed().utils.set_z3_leaf_modules(model, classes)

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
        self.set_deepspeed_weakref()  # transformers follows the selected plugin, as under Accelerate
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
        dtype_on = engine_dtype(mixed_precision)
        for dtype in ("fp16", "bf16"):
            enabled = self.get_value(f"{dtype}.enabled")
            if enabled is None or enabled == "auto":
                continue
            flag = str(enabled).lower() == "true"
            if flag != (dtype_on == dtype):
                auto = f'set "{dtype}": {{"enabled": "auto"}} in the file'
                fix = (f"pass mixed_precision='{dtype}' (or --mixed_precision {dtype}) or {auto}" if flag
                       else f"{auto} or pass a mixed_precision other than '{mixed_precision}'")
                raise conflict(f"{dtype}.enabled", enabled, "the Accelerator's mixed_precision", mixed_precision, fix)

    def resolve_accumulation(self, accelerator_steps: int, given: bool = True) -> int:
        """The accumulation steps both sides use; `given`: the script or launcher set the Accelerator's explicitly.

        A number the DeepSpeed config sets must equal one given to the
        Accelerator; when none was given, the config's number is used. The 1
        written for a config file without one gives way to a number given.

        Example:
            >>> DeepSpeedPlugin(gradient_accumulation_steps=4).resolve_accumulation(1, given=False)
            4
            >>> DeepSpeedPlugin().resolve_accumulation(2)
            2
        """
        value = self.get_value("gradient_accumulation_steps")
        if value is None or value == "auto" or (given and self._accumulation_implied):
            steps = accelerator_steps
        else:
            steps = int(value)
            if given and steps != accelerator_steps:
                raise conflict("gradient_accumulation_steps", steps, "the Accelerator's gradient_accumulation_steps",
                                accelerator_steps, "give the same number in both places, or set it to \"auto\" in the DeepSpeed config")
        self.hf_ds_config.set_value("gradient_accumulation_steps", steps)
        self.gradient_accumulation_steps = steps
        return steps

    def build_engine_config(self, *, world_size: int, mixed_precision: str, device_type: str,
                            micro_batch_size: int | None, client_optimizer: bool | None, optimizer: Any = None,
                            scheduler: Any = None, elastic: ElasticBatch | None = None) -> dict[str, Any]:
        """The config `deepspeed.initialize` gets: every "auto" filled, every disagreement raised (this config unchanged).

        `elastic`: an elastic run's engine accumulation at this size, checked against the recipe at MAX processes.

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
        return engine_config(self, world_size=world_size, mixed_precision=mixed_precision, device_type=device_type,
                             micro_batch_size=micro_batch_size, client_optimizer=client_optimizer, optimizer=optimizer,
                             scheduler=scheduler, elastic=elastic)

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
        init = get("zero3_init_flag")
        init = None if init is None else bool(init)  # not given: the environment's, else whether the config is ZeRO-3
        if file:
            return cls(hf_ds_config=file, zero3_init_flag=init, transformer_moe_cls_names=moe)
        steps = get("gradient_accumulation_steps")
        return cls(
            gradient_accumulation_steps=None if steps in (None, 1) else int(steps),
            gradient_clipping=get("gradient_clipping"),
            zero_stage=int(get("zero_stage", 2)),
            offload_optimizer_device=get("offload_optimizer_device", "none"),
            offload_param_device=get("offload_param_device", "none"),
            offload_optimizer_nvme_path=get("offload_optimizer_nvme_path"),
            offload_param_nvme_path=get("offload_param_nvme_path"),
            zero3_init_flag=init,
            zero3_save_16bit_model=bool(get("zero3_save_16bit_model", False)),
            transformer_moe_cls_names=moe,
        )
