"""What this machine has: is a package installed, a device usable, which version (``accelerate.utils.imports``).

Package probes look for the package without importing it (cheap); device
probes ask torch. hasten has no TPU / Megatron-LM / vendor-accelerator
backend, so those probes say False whatever is installed.

Example:
    >>> from hasten.core.availability import is_torch_xla_available, is_safetensors_available
    >>> is_torch_xla_available()
    False
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import operator
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # `packaging` is imported when a version is compared, not by `import hasten` (import cost)
    from packaging.version import Version

PROBES = [
    "is_aim_available", "is_bf16_available", "is_boto3_available", "is_clearml_available", "is_comet_ml_available",
    "is_cuda_available", "is_datasets_available", "is_deepspeed_available", "is_dvclive_available", "is_fp16_available",
    "is_fp8_available", "is_hpu_available", "is_ipex_available", "is_matplotlib_available", "is_megatron_lm_available",
    "is_mlflow_available", "is_mlu_available", "is_mps_available", "is_musa_available",
    "is_npu_available", "is_numpy_available", "is_pandas_available", "is_peft_available",
    "is_pynvml_available", "is_pytest_available", "is_rich_available", "is_safetensors_available",
    "is_sagemaker_available", "is_schedulefree_available", "is_sdaa_available", "is_swanlab_available",
    "is_tensorboard_available", "is_timm_available", "is_torch_distributed_available", "is_torch_xla_available",
    "is_torchao_available", "is_torchdata_available", "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available", "is_tqdm_available", "is_trackio_available", "is_transformer_engine_available",
    "is_transformers_available", "is_triton_available", "is_wandb_available",
    "is_xpu_available", "is_bnb_available", "is_4bit_bnb_available", "is_8bit_bnb_available",
    "is_bitsandbytes_multi_backend_available",
    "is_lomo_available", "is_rocm_available", "is_import_timer_available", "is_neuron_available", "is_xccl_available",
    "is_habana_gaudi1", "is_transformer_engine_mxfp8_available", "is_amdsmi_available",
]
# The releases from which Accelerate 1.16 offers a feature (its ``utils.constants`` names; tests and libraries
# compare installed versions with them). 1.16 dropped its ``*_PYTORCH_VERSION`` constants with the old torch releases.
MINIMUM_VERSIONS = {
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION": "4.52.0",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION": "0.18.2",
}
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = MINIMUM_VERSIONS["BETA_TP_AVAILABLE_TRANSFORMERS_VERSION"]
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = MINIMUM_VERSIONS["BETA_SP_AVAILABLE_DEEPSPEED_VERSION"]

# Beyond the probes (the peer has them in ``utils.versions``).
__all__ = [*PROBES, "compare_versions", "is_torch_version", "STR_OPERATION_TO_FUNC", "MINIMUM_VERSIONS",
           *MINIMUM_VERSIONS, "torchao_required"]


@functools.lru_cache(maxsize=None)
def _installed(*names: str) -> bool:
    return any(importlib.util.find_spec(name) is not None for name in names)


def _named(probe: Callable[..., bool], name: str, doc: str) -> Callable[..., bool]:
    probe.__name__ = probe.__qualname__ = name
    probe.__doc__ = f"{doc}\n\nExample:\n    >>> from hasten.core.availability import {name}\n    >>> isinstance({name}(), bool)\n    True\n"
    return probe


def _package_probe(name: str, *packages: str) -> Callable[[], bool]:
    def probe() -> bool:
        return _installed(*packages)

    return _named(probe, name, f"True when {' or '.join(packages)} is installed (checked without importing it).")


is_aim_available = _package_probe("is_aim_available", "aim")
is_boto3_available = _package_probe("is_boto3_available", "boto3")
is_clearml_available = _package_probe("is_clearml_available", "clearml")
is_comet_ml_available = _package_probe("is_comet_ml_available", "comet_ml")
is_datasets_available = _package_probe("is_datasets_available", "datasets")
is_deepspeed_available = _package_probe("is_deepspeed_available", "deepspeed")
is_dvclive_available = _package_probe("is_dvclive_available", "dvclive")
is_matplotlib_available = _package_probe("is_matplotlib_available", "matplotlib")
is_mlflow_available = _package_probe("is_mlflow_available", "mlflow")
is_pandas_available = _package_probe("is_pandas_available", "pandas")
is_peft_available = _package_probe("is_peft_available", "peft")
is_pynvml_available = _package_probe("is_pynvml_available", "pynvml")
is_pytest_available = _package_probe("is_pytest_available", "pytest")
is_safetensors_available = _package_probe("is_safetensors_available", "safetensors")
is_sagemaker_available = _package_probe("is_sagemaker_available", "sagemaker")
is_schedulefree_available = _package_probe("is_schedulefree_available", "schedulefree")
is_swanlab_available = _package_probe("is_swanlab_available", "swanlab")
is_tensorboard_available = _package_probe("is_tensorboard_available", "tensorboard", "tensorboardX")
is_timm_available = _package_probe("is_timm_available", "timm")
is_torchao_available = _package_probe("is_torchao_available", "torchao")
is_torchdata_available = _package_probe("is_torchdata_available", "torchdata")
is_torchvision_available = _package_probe("is_torchvision_available", "torchvision")
is_tqdm_available = _package_probe("is_tqdm_available", "tqdm")
is_trackio_available = _package_probe("is_trackio_available", "trackio")
is_transformer_engine_available = _package_probe("is_transformer_engine_available", "transformer_engine")
is_transformers_available = _package_probe("is_transformers_available", "transformers")
is_triton_available = _package_probe("is_triton_available", "triton")
is_wandb_available = _package_probe("is_wandb_available", "wandb")
is_amdsmi_available = _package_probe("is_amdsmi_available", "amdsmi")


def is_rich_available() -> bool:
    """True when rich is installed and asked for (``ACCELERATE_ENABLE_RICH=1``), Accelerate's test for rich output.

    Example:
        >>> isinstance(is_rich_available(), bool)
        True
    """
    import os

    return _installed("rich") and os.environ.get("ACCELERATE_ENABLE_RICH", "").lower() in ("1", "true", "yes", "y",
                                                                                          "on", "t")


def _at_least(package: str, min_version: str | None) -> bool:
    """`package` is installed and, when `min_version` is given, at that version or newer (read from its metadata)."""
    if not _installed(package):
        return False
    if min_version is None:
        return True
    from packaging.version import Version

    try:
        return Version(importlib.metadata.version(package)) >= Version(min_version)
    except importlib.metadata.PackageNotFoundError:  # a folder of that name, not an installed distribution
        return False


def is_bnb_available(min_version: str | None = None) -> bool:
    """True when bitsandbytes is installed (at `min_version` or newer, when given), checked without importing it.

    Example:
        >>> isinstance(is_bnb_available(min_version="0.43.0"), bool)
        True
    """
    return _at_least("bitsandbytes", min_version)


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """True when numpy `min_version` or newer is installed (checked without importing it).

    Example:
        >>> is_numpy_available(min_version="1.0")
        True
    """
    return _at_least("numpy", min_version)


is_4bit_bnb_available = is_bnb_available
is_8bit_bnb_available = is_bnb_available


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether the installed bitsandbytes is its multi-backend build (quantized weights on the CPU too).

    Example:
        >>> isinstance(is_bitsandbytes_multi_backend_available(), bool)
        True
    """
    if not is_bnb_available():
        return False
    bitsandbytes = importlib.import_module("bitsandbytes")  # optional: imported only when installed
    return "multi_backend" in getattr(bitsandbytes, "features", set())
is_lomo_available = _package_probe("is_lomo_available", "lomo_optim")
is_import_timer_available = _package_probe("is_import_timer_available", "import_timer")


def _never(name: str, reason: str, **parameters: Any) -> Callable[..., bool]:
    """A probe answering False; it takes Accelerate's `parameters` (by name, with their defaults) and ignores them."""

    def probe(*args: Any, **kwargs: Any) -> bool:
        return False

    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    probe.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(key, keyword, default=value) for key, value in parameters.items()], return_annotation=bool)
    return _named(probe, name, f"Always False: {reason}.")


is_torch_xla_available = _never("is_torch_xla_available", "hasten has no TPU / XLA backend", check_is_tpu=False,
                                check_is_gpu=False)
is_megatron_lm_available = _never("is_megatron_lm_available", "hasten has no Megatron-LM engine")
is_ipex_available = _never("is_ipex_available", "hasten does not use Intel Extension for PyTorch")
for _name in ("mlu", "sdaa", "musa", "npu", "neuron"):
    globals()[f"is_{_name}_available"] = _never(f"is_{_name}_available", f"hasten has no {_name.upper()} backend",
                                                check_device=False)
is_hpu_available = _never("is_hpu_available", "hasten has no HPU (Gaudi) backend", init_hccl=False)
is_habana_gaudi1 = _never("is_habana_gaudi1", "hasten has no HPU (Gaudi) backend")


def torchao_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calling `func` without torchao installed raises ImportError saying to install it.

    Example:
        >>> @torchao_required
        ... def convert(): return "converted"
        >>> convert() if is_torchao_available() else "converted"
        'converted'
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__name__} needs torchao, which is not installed; install it with "
                              "`pip install torchao`.")
        return func(*args, **kwargs)

    return wrapper


def is_transformer_engine_mxfp8_available() -> bool:
    """True when NVIDIA Transformer Engine is installed and says this GPU can compute in MXFP8.

    Example:
        >>> isinstance(is_transformer_engine_mxfp8_available(), bool)
        True
    """
    if not is_transformer_engine_available():
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support  # the engine's own check

    return bool(check_mxfp8_support()[0])


def is_torch_distributed_available() -> bool:
    """True when torch was built with torch.distributed.

    Example:
        >>> is_torch_distributed_available()
        True
    """
    import torch.distributed

    return torch.distributed.is_available()


def is_cuda_available() -> bool:
    """True when a CUDA GPU is usable.

    Example:
        >>> isinstance(is_cuda_available(), bool)
        True
    """
    import torch

    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    """True when torch is a ROCm (AMD) build.

    Example:
        >>> isinstance(is_rocm_available(), bool)
        True
    """
    import torch

    return torch.version.hip is not None


def is_mps_available(min_version: str = "1.12") -> bool:
    """True when Apple's MPS device is usable.

    Example:
        >>> isinstance(is_mps_available(), bool)
        True
    """
    import torch

    return torch.backends.mps.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    """True when an Intel XPU is usable.

    Example:
        >>> isinstance(is_xpu_available(), bool)
        True
    """
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_xccl_available() -> bool:
    """True when torch.distributed has the XCCL backend.

    Example:
        >>> isinstance(is_xccl_available(), bool)
        True
    """
    import torch.distributed as dist

    return bool(getattr(dist, "is_xccl_available", lambda: False)())


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bf16 mixed precision works here (CPU: always; CUDA: Ampere or newer).

    Example:
        >>> is_bf16_available()
        True
    """
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """True when fp16 autocast works here.

    Example:
        >>> isinstance(is_fp16_available(), bool)
        True
    """
    import torch

    return torch.amp.is_autocast_available("cuda" if torch.cuda.is_available() else "cpu")


def is_fp8_available() -> bool:
    """True when an fp8 backend (torchao or Transformer Engine) is installed (hasten trains in fp8 through either).

    Example:
        >>> isinstance(is_fp8_available(), bool)
        True
    """
    return is_torchao_available() or is_transformer_engine_available()


def is_torchdata_stateful_dataloader_available() -> bool:
    """True when torchdata's StatefulDataLoader can be imported.

    Example:
        >>> isinstance(is_torchdata_stateful_dataloader_available(), bool)
        True
    """
    return _installed("torchdata") and importlib.util.find_spec("torchdata.stateful_dataloader") is not None


# -- versions ------------------------------------------------------------
_OPERATIONS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}
STR_OPERATION_TO_FUNC = _OPERATIONS  # Accelerate's name for the same table (accelerate.utils.constants)


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (or a version) with `requirement_version`.

    Example:
        >>> compare_versions("1.2.0", "<", "1.10")
        True
    """
    from packaging.version import Version

    if operation not in _OPERATIONS:
        raise ValueError(f"operation {operation!r} is not one of {', '.join(_OPERATIONS)}.")
    version = library_or_version
    if isinstance(library_or_version, str):
        try:
            version = Version(library_or_version)
        except ValueError:
            version = Version(importlib.metadata.version(library_or_version))
    return _OPERATIONS[operation](version, Version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch's version (without its local part, e.g. "+cpu") with `version`.

    Example:
        >>> is_torch_version("<", "100.0")
        True
    """
    import torch
    from packaging.version import Version

    return compare_versions(Version(Version(torch.__version__).base_version), operation, version)
