"""Accelerate's `accelerate tpu-config` (``accelerate.commands.tpu``): run set-up commands on every worker of a TPU pod.

hasten trains on no TPU, but this command only assembles a ``gcloud compute
tpus tpu-vm ssh`` call (the commands from `--command`, `--command_file` or
the config file's `commands` / `command_file`, after ``cd /usr/share`` and,
with `--install_accelerate`, a pip install) and runs it, or prints it with
`--debug`; it behaves as Accelerate's.

Example:
    >>> args = tpu_command_parser().parse_args(["--command", "ls", "--tpu_name", "pod", "--tpu_zone", "z", "--debug"])
    >>> tpu_command_launcher(args)
    Running gcloud compute tpus tpu-vm ssh pod --zone z --command cd /usr/share; ls --worker all
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import Any

from ..launch.accelerate_config_file import default_config_file, load_config_from_file

__all__ = ["tpu_command_parser", "tpu_command_launcher", "main"]

_DESCRIPTION = "Run commands on every TPU VM of a pod, as set-up before `accelerate launch`."


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `tpu-config` parser: alone, or as the `tpu-config` sub-command of `subparsers`."""
    parser = (subparsers.add_parser("tpu-config", description=_DESCRIPTION) if subparsers is not None
              else argparse.ArgumentParser("Accelerate tpu-config command", description=_DESCRIPTION))
    config = parser.add_argument_group("Config Arguments", "What `accelerate config` may also set.")
    config.add_argument("--config_file", type=str, default=None, help="the config file to read")
    config.add_argument("--tpu_name", default=None, help="the TPU (default: the config file's)")
    config.add_argument("--tpu_zone", default=None, help="the TPU's zone (default: the config file's)")
    pod = parser.add_argument_group("TPU Arguments", "What runs on the TPU VMs.")
    pod.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha`")
    pod.add_argument("--command_file", default=None, help="a file of commands, one a line")
    pod.add_argument("--command", action="append", nargs="+", help="a command to run (may be repeated)")
    pod.add_argument("--install_accelerate", action="store_true", help="pip install accelerate on the VMs first")
    pod.add_argument("--accelerate_version", default="latest",
                     help="the accelerate version to install: a version, 'latest' or 'dev' (from GitHub)")
    pod.add_argument("--debug", action="store_true", help="print the gcloud command instead of running it")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def _install_target(version: str) -> str:
    """What pip installs for `--accelerate_version`."""
    from packaging.version import InvalidVersion, Version

    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    try:
        Version(version)
    except InvalidVersion:
        return version
    return f"accelerate=={version}"


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Assemble the gcloud call for the pod's workers and run it (print it with `args.debug`)."""
    if args.config_file is not None or os.path.isfile(default_config_file):
        defaults: Any = load_config_from_file(args.config_file)
        if not args.command_file and getattr(defaults, "command_file", None) is not None and not args.command:
            args.command_file = defaults.command_file
        if not args.command and getattr(defaults, "commands", None) is not None:
            args.command = defaults.commands
        args.tpu_name = args.tpu_name or getattr(defaults, "tpu_name", None)
        args.tpu_zone = args.tpu_zone or getattr(defaults, "tpu_zone", None)
    args.accelerate_version = _install_target(args.accelerate_version)
    if not args.command_file and not args.command:
        raise ValueError("You must specify either a command file or a command to run on the pod (--command_file or "
                         "--command).")
    if args.command_file:
        with open(args.command_file) as handle:
            args.command = [handle.read().splitlines()]
    lines = [line for group in args.command for line in group] if isinstance(args.command[0], list) else args.command
    steps = ["cd /usr/share", *([f"pip install {args.accelerate_version}"] if args.install_accelerate else []), *lines]
    args.command = "; ".join(steps)
    cmd = ["gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm", "ssh", args.tpu_name,
           "--zone", args.tpu_zone, "--command", args.command, "--worker", "all"]
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return
    subprocess.run(cmd)
    print("Successfully setup pod.")


def main() -> None:
    """`accelerate-tpu-config`: parse the command line and run.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    tpu_command_launcher(tpu_command_parser().parse_args())
