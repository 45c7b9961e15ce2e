"""Where a `DeepSpeedPlugin`'s unset fields come from: the variables a launcher exports, read as Accelerate reads them.

`hasten launch --use_deepspeed` and `accelerate launch --use_deepspeed`
export ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``ACCELERATE_GRADIENT_CLIPPING``,
``ACCELERATE_DEEPSPEED_CONFIG_FILE``, ...; a plugin built in the launched
script (transformers' `TrainingArguments` builds one) reads them for every
field left as None.

Example:
    >>> from types import SimpleNamespace
    >>> fields = dict.fromkeys(["gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
    ...     "offload_param_device", "offload_optimizer_nvme_path", "offload_param_nvme_path", "zero3_save_16bit_model",
    ...     "hf_ds_config"])
    >>> plugin = SimpleNamespace(**fields)
    >>> read_environment(plugin, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_GRADIENT_CLIPPING": "0.5"})
    >>> plugin.zero_stage, plugin.gradient_clipping, plugin.gradient_accumulation_steps, plugin.hf_ds_config
    (3, 0.5, 'auto', 'none')
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["read_environment", "check_launcher_fields"]

# Launcher settings a config file replaces: Accelerate refuses a launch config that gives them beside the file.
_FILE_REPLACES = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                  "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                  "zero3_save_16bit_model", "mixed_precision")


def read_environment(plugin: Any, env: Mapping[str, str]) -> None:
    """Accelerate's reading of the launcher's variables into `plugin`'s fields left as None (see the module's example)."""
    if plugin.gradient_accumulation_steps is None:
        steps = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "auto")
        plugin.gradient_accumulation_steps = int(steps) if steps.isdigit() else steps
    if plugin.gradient_clipping is None:
        clip = env.get("ACCELERATE_GRADIENT_CLIPPING", "auto")
        plugin.gradient_clipping = clip if clip == "auto" else float(clip)
    if plugin.zero_stage is None:
        plugin.zero_stage = int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", 2))
    for name, variable in (("offload_optimizer_device", "OFFLOAD_OPTIMIZER_DEVICE"), ("offload_param_device", "OFFLOAD_PARAM_DEVICE"),
                           ("offload_optimizer_nvme_path", "OFFLOAD_OPTIMIZER_NVME_PATH"),
                           ("offload_param_nvme_path", "OFFLOAD_PARAM_NVME_PATH")):
        if getattr(plugin, name) is None:
            setattr(plugin, name, env.get(f"ACCELERATE_DEEPSPEED_{variable}", "none"))
    if plugin.zero3_save_16bit_model is None:
        plugin.zero3_save_16bit_model = env.get("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "false").lower() == "true"
    if plugin.hf_ds_config is None:
        plugin.hf_ds_config = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")


def check_launcher_fields(env: Mapping[str, str]) -> None:
    """Accelerate's check: a launch config may not give the settings a DeepSpeed config file replaces.

    Example:
        >>> check_launcher_fields({"ACCELERATE_CONFIG_DS_FIELDS": "zero_stage,deepspeed_config_file"})
        Traceback (most recent call last):
        ...
        ValueError: the launch config gives zero_stage beside deepspeed_config_file, which replaces them; remove them from the launch config and set them in the DeepSpeed config file.
    """
    fields = [name for name in env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",") if name]
    clashing = [name for name in fields if name in _FILE_REPLACES]
    if clashing:
        raise ValueError(f"the launch config gives {', '.join(clashing)} beside deepspeed_config_file, which "
                         "replaces them; remove them from the launch config and set them in the DeepSpeed config file.")
