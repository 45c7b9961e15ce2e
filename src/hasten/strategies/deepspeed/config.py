"""A DeepSpeed JSON config read and written by dotted keys, with its ``"auto"`` values found; importing DeepSpeed.

Example:
    >>> from hasten.strategies.deepspeed.config import HfDeepSpeedConfig
    >>> HfDeepSpeedConfig({"zero_optimization": {"stage": 2}}).is_zero2()
    True
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

from ...core.errors import DeepSpeedConfigError

__all__ = ["HfDeepSpeedConfig", "require_deepspeed", "INSTALL_HINT", "contains_auto", "auto_keys", "tell_transformers"]

INSTALL_HINT = "pip install 'hasten[deepspeed]'"


def require_deepspeed() -> Any:
    """Import and return `deepspeed`, or raise one error that says how to install it.

    Example:
        >>> callable(require_deepspeed)
        True
    """
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(f"this run uses DeepSpeed, which is not installed ({error}); install it with: {INSTALL_HINT}") from None
    return deepspeed


class HfDeepSpeedConfig:
    """A DeepSpeed JSON config (a path or a dict), read with dotted keys such as ``"zero_optimization.stage"``.

    Example:
        >>> config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"})
        >>> config.get_value("zero_optimization.stage"), config.is_zero3(), config.is_auto("train_micro_batch_size_per_gpu")
        (3, True, True)
    """

    def __init__(self, config_file_or_dict: str | Path | dict[str, Any]) -> None:
        if isinstance(config_file_or_dict, dict):
            config = copy.deepcopy(config_file_or_dict)  # the caller's dict is never changed
        else:
            config = _read_config(config_file_or_dict)
        if not isinstance(config, dict):
            raise DeepSpeedConfigError("a DeepSpeed config must be a JSON object (a dict); fix the file.")
        self.config: dict[str, Any] = config

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of a dotted key, and that part (None when a parent is missing).

        Example:
            >>> HfDeepSpeedConfig({"zero_optimization": {"stage": 2}}).find_config_node("zero_optimization.stage")
            ({'stage': 2}, 'stage')
        """
        node: Any = self.config
        *parents, last = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, last
        return (node if isinstance(node, dict) else None), last

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove a section (e.g. ``"optimizer"``); a missing one is fine unless `must_exist`.

        Example:
            >>> config = HfDeepSpeedConfig({"optimizer": {"type": "AdamW"}})
            >>> config.del_config_sub_tree("optimizer"); config.config
            {}
        """
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise DeepSpeedConfigError(f"the DeepSpeed config has no {ds_key_long} entry to remove; check the key.")
            return
        del node[key]

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def set_value(self, ds_key_long: str, value: Any) -> None:
        node: dict[str, Any] = self.config
        *parents, last = ds_key_long.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def is_auto(self, ds_key_long: str) -> bool:
        return self.get_value(ds_key_long) == "auto"

    def is_true(self, ds_key_long: str) -> bool:
        """True when the key is set to a truthy value, as Accelerate's: ``"auto"`` counts (a missing key does not).

        Example:
            >>> config = HfDeepSpeedConfig({"bf16": {"enabled": "auto"}, "fp16": {"enabled": False}})
            >>> config.is_true("bf16.enabled"), config.is_true("fp16.enabled"), config.is_true("missing")
            (True, False, False)
        """
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True when the key is set to a falsy value, as Accelerate's (a missing key is neither true nor false).

        Example:
            >>> HfDeepSpeedConfig({"fp16": {"enabled": False}}).is_false("fp16.enabled")
            True
        """
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def set_stage_and_offload(self) -> None:
        """Accelerate's refresh of the cached stage and offload; hasten reads both from the config on each call.

        Example:
            >>> config = HfDeepSpeedConfig({"zero_optimization": {"stage": 2}})
            >>> config.config["zero_optimization"]["stage"] = 3; config.set_stage_and_offload(); config.is_zero3()
            True
        """

    def zero_stage(self) -> int:
        stage = self.get_value("zero_optimization.stage", 0)
        return int(stage) if stage != "auto" else -1

    def is_zero2(self) -> bool:
        return self.zero_stage() == 2

    def is_zero3(self) -> bool:
        return self.zero_stage() == 3

    def is_offload(self) -> bool:
        """True when ZeRO-2 or -3 offloads the optimizer or the parameters to the CPU or NVMe.

        Example:
            >>> HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}).is_offload()
            True
        """
        return (self.is_zero2() or self.is_zero3()) and any(
            self.get_value(f"zero_optimization.{part}.device") in ("cpu", "nvme") for part in ("offload_optimizer", "offload_param"))


def _read_config(source: str | Path) -> Any:
    """A config from a JSON file, a JSON string or base64-encoded JSON (what Accelerate's launcher passes on)."""
    path = Path(source)
    text = str(source)
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise DeepSpeedConfigError(f"the DeepSpeed config file {path} is not valid JSON ({error}); fix the file.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise FileNotFoundError(f"the DeepSpeed config file {path} does not exist (nor is it JSON text); pass an "
                                "existing JSON file or a dict.") from None


def contains_auto(value: Any) -> bool:
    """True when `value` is "auto" or a dict holding "auto" at any depth.

    Example:
        >>> contains_auto({"a": {"b": "auto"}}), contains_auto(3)
        (True, False)
    """
    if isinstance(value, dict):
        return any(contains_auto(v) for v in value.values())
    return value == "auto"


def auto_keys(config: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose value is still "auto".

    Example:
        >>> auto_keys({"train_batch_size": "auto", "zero_optimization": {"stage": "auto"}})
        ['train_batch_size', 'zero_optimization.stage']
    """
    keys = []
    for key, value in config.items():
        if isinstance(value, dict):
            keys += auto_keys(value, f"{prefix}{key}.")
        elif value == "auto":
            keys.append(prefix + key)
    return keys


def tell_transformers(config: dict[str, Any]) -> Any:
    """Point transformers' DeepSpeed weak reference at `config`; returns the object to keep alive (None: no transformers).

    transformers answers `is_deepspeed_zero3_enabled()` and `deepspeed_config()`
    from that reference (`from_pretrained` then builds models partitioned under
    ZeRO-3). It is handed an `HfDeepSpeedConfig` of hasten's, which has what it
    reads (`is_zero3()`, `config`). Importing transformers' DeepSpeed module
    imports Accelerate's `utils.deepspeed` when both are installed: under the
    accelerate switch that is hasten's; without it transformers imports
    Accelerate itself, as it would for its own `Trainer`.

    Example:
        >>> holder = tell_transformers({"zero_optimization": {"stage": 3}})
        >>> from transformers.integrations.deepspeed import deepspeed_config, is_deepspeed_zero3_enabled
        >>> is_deepspeed_zero3_enabled(), deepspeed_config() is holder.config
        (True, True)
    """
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers.integrations import deepspeed as hf_deepspeed

    hf_deepspeed.unset_hf_deepspeed_config()
    holder = HfDeepSpeedConfig(config)
    hf_deepspeed.set_hf_deepspeed_config(holder)
    return holder
