"""The one typed value a launcher hands to every process it starts.

Settings travel as a single JSON blob in one environment variable, instead
of a dozen loosely typed variables spread across modules. `Accelerator()`
reads it once; explicit constructor arguments win over it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Mapping

__all__ = ["LaunchSpec", "SPEC_ENV_VAR", "MIXED_PRECISION_CHOICES", "fp8_problem"]

SPEC_ENV_VAR = "HASTEN_LAUNCH_SPEC"
# The one list of mixed precision choices (flags, config files, Accelerator); "fp8" is refused by `fp8_problem`.
MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")


def fp8_problem() -> str:
    """The one sentence that refuses mixed_precision="fp8" (imports nothing: usable before torch is loaded).

    Example:
        >>> fp8_problem().startswith("mixed_precision='fp8'")
        True
    """
    from importlib.util import find_spec

    if find_spec("torchao") is None and find_spec("transformer_engine") is None:
        return ("mixed_precision='fp8' needs torchao or NVIDIA Transformer Engine and neither is installed; "
                "install one (pip install torchao) or use mixed_precision='bf16'.")
    return "mixed_precision='fp8' training is not built into this hasten version yet; use mixed_precision='bf16'."


@dataclass(frozen=True)
class LaunchSpec:
    """What `hasten launch` decided, as seen by each process.

    Example:
        >>> spec = LaunchSpec(mixed_precision="bf16", cpu=True)
        >>> LaunchSpec.from_env(spec.to_env()) == spec
        True
    """

    mixed_precision: str | None = None
    cpu: bool = False
    debug: bool = False
    gradient_accumulation_steps: int | None = None
    deepspeed: dict | None = None  # DeepSpeedConfig fields, when the run uses DeepSpeed
    fsdp: dict | None = None  # FSDPConfig fields, when the run uses FSDP

    def __post_init__(self) -> None:
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION_CHOICES)}."
            )
        if self.mixed_precision == "fp8":
            raise ValueError(fp8_problem())

    def to_env(self) -> dict[str, str]:
        return {SPEC_ENV_VAR: json.dumps(asdict(self), sort_keys=True)}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "LaunchSpec":
        env = os.environ if env is None else env
        raw = env.get(SPEC_ENV_VAR)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{SPEC_ENV_VAR} is not valid JSON ({err}); unset it or launch with `hasten launch`.") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{SPEC_ENV_VAR} has unknown keys {unknown}: the launcher and this process run different hasten versions."
            )
        return cls(**data)
