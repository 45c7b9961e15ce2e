"""`hasten env` (and the peer's `accelerate env`): what to paste into a bug report."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from shutil import which
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
    info["mpirun"] = which("mpirun") or "not found"
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


# -- the peer's `accelerate env` ------------------------------------------------------------------------------------
def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `env` parser: alone, or as the `env` sub-command of `subparsers`.

    Example:
        >>> env_command_parser().parse_args([]).config_file is None
        True
    """
    parser = (subparsers.add_parser("env") if subparsers is not None
              else argparse.ArgumentParser("Accelerate env command"))
    parser.add_argument("--config_file", default=None, help="the config file to show (default: Accelerate's)")
    if subparsers is not None:
        parser.set_defaults(func=env_command)
    return parser


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print Accelerate's bug-report facts (versions, platform, accelerator, RAM, the config) and return them."""
    from .. import __version__
    from ..launch.accelerate_config_file import default_config_file, load_config_from_file

    info: dict[str, Any] = {"`Accelerate` version": __version__, "Platform": platform.platform(),
                            "`accelerate` bash location": which("accelerate") or "Not found",
                            "Python version": platform.python_version(),
                            "Numpy version": _version("numpy") or "Not found"}
    try:
        import torch

        accelerator = "CUDA" if torch.cuda.is_available() else "MPS" if torch.backends.mps.is_available() else "N/A"
        info.update({"PyTorch version": torch.__version__, "PyTorch accelerator": accelerator})
    except ImportError:
        info.update({"PyTorch version": "Not found", "PyTorch accelerator": "N/A"})
    info["System RAM"] = _memory_gib()
    if info["PyTorch accelerator"] == "CUDA":
        info["GPU type"] = torch.cuda.get_device_name()
    config: Any = "Not found"
    if args.config_file is not None or os.path.isfile(default_config_file):
        config = load_config_from_file(args.config_file).to_dict()
    print("\nCopy-and-paste the text below in your GitHub issue\n")
    print("\n".join(f"- {key}: {value}" for key, value in info.items()))
    print("- `Accelerate` default config:" if args.config_file is None else "- `Accelerate` config passed:")
    print("\n".join(f"\t- {key}: {value}" for key, value in config.items()) if isinstance(config, dict)
          else f"\t{config}")
    info["`Accelerate` configs"] = config
    return info


def main() -> int:
    """`python -m` entry of the peer's command.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    env_command(env_command_parser().parse_args())
    return 0
