"""`hasten env`: what to paste into a bug report."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from typing import Any

_INTEGRATIONS = ("deepspeed", "transformers", "safetensors", "tensorboard", "wandb", "mlflow", "torchvision", "numpy",
                 "scikit-learn", "tqdm", "pyyaml")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("env", help="print versions, hardware and the default config (for bug reports)")
    parser.add_argument("--config_file", "--config-file", default=None, metavar="PATH",
                        help="config file to show (default: the default path)")
    parser.set_defaults(run=run, parser=parser)
    return parser


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory_gib() -> str:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return f"{pages * page_size / 2**30:.1f} GiB"
    except (ValueError, OSError, AttributeError):
        return "unknown"


def collect(config_file: str | None = None) -> dict[str, Any]:
    """The facts `hasten env` prints, as a dict."""
    from .. import __version__
    from ..launch.config import ConfigError, default_config_path, load_config, to_dict
    from ..launch.plan import available_cpus

    info: dict[str, Any] = {
        "hasten": __version__,
        "Python": sys.version.split()[0],
        "platform": platform.platform(),
        "CPU cores (usable)": available_cpus(),
        "RAM": _memory_gib(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["CUDA available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["CUDA"] = torch.version.cuda
            info["NCCL"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["GPUs"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        else:
            info["GPUs"] = []
        mps = getattr(torch.backends, "mps", None)
        info["MPS available"] = bool(mps and mps.is_available())
        info["bf16 on CPU (avx512_bf16)"] = _cpu_flag("avx512_bf16")
    except ImportError:
        info["torch"] = "not installed"
    info["integrations"] = {name: _version(name) for name in _INTEGRATIONS if _version(name)}
    import shutil

    info["mpirun"] = shutil.which("mpirun") or "not found"
    path = config_file or str(default_config_path())
    try:
        info["config file"] = path if os.path.exists(path) else f"{path} (absent: defaults used)"
        info["config"] = to_dict(load_config(config_file))
    except ConfigError as error:
        info["config"] = f"unreadable: {error}"
    return info


def _cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as handle:
            return any(flag in line.split() for line in handle if line.startswith("flags"))
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    info = collect(args.config_file)
    print("Copy-and-paste the text below into your bug report.\n")
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"- {key}:")
            for sub_key, sub_value in value.items():
                print(f"    {sub_key}: {sub_value}")
        else:
            print(f"- {key}: {value}")
    return 0
