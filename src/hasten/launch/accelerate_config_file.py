"""Accelerate's config-file objects (``accelerate.commands.config.config_args``), with their meaning.

`hasten launch` reads config files through its own schema (`launch.config`);
these are the objects Accelerate's API hands out for the same files —
`ClusterConfig` for a run on this machine or a cluster, `SageMakerConfig`
for an Amazon SageMaker job — which libraries and Accelerate-style launch
code (`accelerate launch` under the switch) read: Accelerate's keys and
defaults, distributed types as enums, a file with keys these classes do
not have refused in one sentence that names them.

The default file is Accelerate's (``$HF_HOME/accelerate/default_config.yaml``),
not `hasten config`'s.

Example:
    >>> config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="NO",
    ...                        mixed_precision="no", use_cpu=True, debug=False)
    >>> config.distributed_type, config.num_processes
    (<DistributedType.NO: 'NO'>, -1)
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from ..options.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType

__all__ = ["BaseConfig", "ClusterConfig", "SageMakerConfig", "load_config_from_file", "config_object", "hf_cache_home", "cache_dir",
           "default_config_file", "default_json_config_file", "default_yaml_config_file",
           "SAGEMAKER_PYTORCH_VERSION", "SAGEMAKER_PYTHON_VERSION", "SAGEMAKER_TRANSFORMERS_VERSION",
           "SAGEMAKER_PARALLEL_EC2_INSTANCES"]

# The framework versions Accelerate asks SageMaker for by default.
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")))
cache_dir = os.path.join(hf_cache_home, "accelerate")
default_json_config_file = os.path.join(cache_dir, "default_config.yaml")  # the same name: Accelerate's too
default_yaml_config_file = os.path.join(cache_dir, "default_config.yaml")
default_config_file = (default_yaml_config_file if os.path.isfile(default_yaml_config_file)
                       or not os.path.isfile(default_json_config_file) else default_json_config_file)


def _read(path: str) -> Any:
    import yaml

    with open(path, encoding="utf-8") as handle:
        return json.load(handle) if path.endswith(".json") else yaml.safe_load(handle)


def load_config_from_file(config_file: str | None) -> "ClusterConfig | SageMakerConfig":
    """The config in `config_file` (Accelerate's default file when None), as a `ClusterConfig` or `SageMakerConfig`.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = path.write_text("distributed_type: MULTI_CPU\\nnum_processes: 2\\n")
        >>> load_config_from_file(str(path)).num_processes
        2
    """
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist; pass the path of an existing file, or "
            "write the default one with `accelerate config` (or `hasten config`) and leave out --config_file.")
    path = default_config_file if config_file is None else config_file
    data = _read(path) or {}
    local = data.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE) == ComputeEnvironment.LOCAL_MACHINE
    kind = ClusterConfig if local else SageMakerConfig
    return kind.from_json_file(path) if path.endswith(".json") else kind.from_yaml_file(path)


def config_object(data: dict[str, Any]) -> "ClusterConfig | SageMakerConfig":
    """Accelerate's object for a config file's keys (what `_validate_launch_command` returns); hasten-only keys left out.

    Example:
        >>> config_object({"distributed_type": "MULTI_CPU", "num_processes": 2, "liveness_timeout": 30}).num_processes
        2
    """
    data = {"distributed_type": "NO", **data}
    local = data.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE) == ComputeEnvironment.LOCAL_MACHINE
    kind = ClusterConfig if local else SageMakerConfig
    data = kind.process_config(data)
    return kind(**{key: value for key, value in data.items() if key in {f.name for f in fields(kind)}})


def _plain(value: Any) -> Any:
    """An enum as its value, an empty section as None (dropped when written), recursively."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()} or None
    return value


@dataclass
class BaseConfig:
    """What every Accelerate config file holds: where it runs, the kind of run, precision, CPU, debug.

    Example:
        >>> BaseConfig("LOCAL_MACHINE", "NO", "fp16", False, False).to_dict()["mixed_precision"]
        'fp16'
    """

    compute_environment: ComputeEnvironment
    distributed_type: Union[DistributedType, SageMakerDistributedType]
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values, without those that are None or empty sections."""
        return {key: value for key, value in ((k, _plain(v)) for k, v in self.__dict__.items()) if value is not None}

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill what a file may leave out, and bring old layouts (`fp16`, `dynamo_backend`) to the current one."""
        if "distributed_type" not in config_dict:
            raise ValueError("A `distributed_type` must be specified in the config file; add one (for example "
                             "`distributed_type: 'NO'`).")
        config_dict.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
        if "num_processes" not in config_dict and config_dict["distributed_type"] == DistributedType.NO:
            config_dict["num_processes"] = 1
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config_dict.setdefault(key, False)
        return config_dict

    @classmethod
    def _from_file(cls, path: str) -> Any:
        data = cls.process_config(_read(path) or {})
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"The config file at {path} had unknown keys ({unknown}); remove or fix them (they may "
                             "come from a newer Accelerate).")
        return cls(**data)

    @classmethod
    def from_json_file(cls, json_file: str | None = None) -> Any:
        """Read a JSON config file (Accelerate's default file when None)."""
        return cls._from_file(default_json_config_file if json_file is None else json_file)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None) -> Any:
        """Read a YAML config file (Accelerate's default file when None)."""
        return cls._from_file(default_yaml_config_file if yaml_file is None else yaml_file)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the config as sorted, indented JSON."""
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the config as YAML."""
        import yaml

        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def __post_init__(self) -> None:
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str):
            kind = (SageMakerDistributedType if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
                    else DistributedType)
            self.distributed_type = kind(self.distributed_type)
        if getattr(self, "dynamo_config", None) is None:
            setattr(self, "dynamo_config", {})  # noqa: B010 - a field of the subclasses, not of this one


@dataclass
class ClusterConfig(BaseConfig):
    """A run on this machine or a cluster of machines (Accelerate's `compute_environment: LOCAL_MACHINE`).

    Example:
        >>> ClusterConfig("LOCAL_MACHINE", "MULTI_GPU", "no", False, False, num_processes=2).fsdp_config
        {}
    """

    num_processes: int = -1  # -1: decided at launch (e.g. under SLURM)
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: Optional[str] = None
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None
    rdzv_backend: Optional[str] = "static"
    same_network: Optional[bool] = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: Optional[dict] = None
    deepspeed_config: Optional[dict] = None
    fsdp_config: Optional[dict] = None
    parallelism_config: Optional[dict] = None
    megatron_lm_config: Optional[dict] = None
    mpirun_config: Optional[dict] = None
    downcast_bf16: bool = False
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: Optional[str] = None
    commands: Optional[list[str]] = None
    tpu_vm: Optional[list[str]] = None
    tpu_env: Optional[list[str]] = None
    dynamo_config: Optional[dict] = None

    def __post_init__(self) -> None:
        for name in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config", "fp8_config",
                     "parallelism_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """An Amazon SageMaker job (`compute_environment: AMAZON_SAGEMAKER`); hasten reads it but launches no such job.

    Example:
        >>> SageMakerConfig("AMAZON_SAGEMAKER", "NO", "no", False, False, "ml.p3.2xlarge", "role").region
        'us-east-1'
    """

    ec2_instance_type: str
    iam_role_name: str
    image_uri: Optional[str] = None
    profile: Optional[str] = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: Optional[str] = None
    sagemaker_metrics_file: Optional[str] = None
    additional_args: Optional[dict] = None
    dynamo_config: Optional[dict] = None
    enable_cpu_affinity: bool = False
