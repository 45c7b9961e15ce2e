"""Accelerate's `accelerate config` (``accelerate.commands.config``): the questionnaire, `default` and `update`.

The questions are `hasten config`'s; the answers are written as Accelerate
writes them (`ClusterConfig`, Accelerate's keys only) to Accelerate's
default file unless `--config_file` names another, so both `accelerate
launch` and `hasten launch --config_file` read the result.

Example:
    >>> parser = get_config_parser()
    >>> parser.parse_args(["default", "--mixed_precision", "bf16"]).mixed_precision
    'bf16'
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..launch.config import LaunchConfig, to_dict
from ..launch.accelerate_config_file import (ClusterConfig, SageMakerConfig, cache_dir, default_config_file,
                                  default_json_config_file, default_yaml_config_file, load_config_from_file)
from .basic_config import write_basic_config

__all__ = ["SubcommandHelpFormatter", "cluster_config", "get_cluster_input", "get_sagemaker_input", "get_user_input",
           "config_command_parser", "config_command", "get_config_parser", "default_command_parser",
           "default_config_command", "update_config", "update_command_parser", "update_config_command", "main",
           "write_basic_config"]

_WHERE = ("where the config file goes (default: default_config.yaml under $HF_HOME/accelerate, or "
          "~/.cache/huggingface/accelerate)")


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help of the `config` sub-commands: the usage line without the redundant sub-command list.

    Example:
        >>> SubcommandHelpFormatter(prog="accelerate config default")._prog
        'accelerate config default'
    """

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")


def cluster_config(config: LaunchConfig) -> ClusterConfig:
    """A hasten launch config as Accelerate's `ClusterConfig` (the keys Accelerate's file has; mpirun in `mpirun_config`).

    Example:
        >>> cluster_config(LaunchConfig(distributed_type="MULTI_CPU", num_processes=2, use_cpu=True)).num_processes
        2
    """
    data = to_dict(config)
    known = {f.name for f in fields(ClusterConfig)}
    kept = {key: value for key, value in data.items() if key in known}
    kept["compute_environment"] = "LOCAL_MACHINE"  # hasten's CLUSTER is Accelerate's LOCAL_MACHINE on each machine
    if config.mpirun:
        kept["mpirun_config"] = {"mpirun_hostfile": config.mpirun_hostfile}
    return ClusterConfig(**kept)


def get_cluster_input() -> ClusterConfig:
    """Ask `hasten config`'s questions; the answers as a `ClusterConfig`."""
    from .config_command import ask_answers

    return cluster_config(ask_answers())


def get_sagemaker_input() -> SageMakerConfig:
    """Refused: hasten starts no Amazon SageMaker job, so it asks no SageMaker questions."""
    raise NotImplementedError("hasten does not start Amazon SageMaker jobs; configure this machine instead "
                              "(`accelerate config` without SageMaker).")


def get_user_input() -> ClusterConfig:
    """The questionnaire of `accelerate config`: a config for this machine (or each machine of a cluster)."""
    return get_cluster_input()


def _write(config: ClusterConfig | SageMakerConfig, path: str) -> None:
    if path.endswith(".json"):
        config.to_json_file(path)
    else:
        config.to_yaml_file(path)


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `config` parser: alone, or as the `config` sub-command of `subparsers`."""
    description = "Ask about this machine and write the config file `accelerate launch` reads."
    parser = (subparsers.add_parser("config", description=description) if subparsers is not None
              else argparse.ArgumentParser("Accelerate config command", description=description))
    parser.add_argument("--config_file", default=None, help=_WHERE)
    if subparsers is not None:
        parser.set_defaults(func=config_command)
    return parser


def config_command(args: argparse.Namespace) -> None:
    """Ask the questions and write the answers (Accelerate's default file unless `args.config_file`)."""
    from . import prompts

    try:
        config = get_user_input()
    except prompts.Aborted:
        print("accelerate config: aborted; no file was written.")
        return
    path = args.config_file
    if path is None:
        os.makedirs(cache_dir, exist_ok=True)
        path = default_yaml_config_file
    _write(config, path)
    print(f"accelerate configuration saved at {path}")


def default_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `config default` sub-command under `parser` (the sub-parsers of `config`)."""
    description = "Write a config for this machine without questions (one process per GPU, else the CPU)."
    sub = parser.add_parser("default", parents=parents, help=description, formatter_class=SubcommandHelpFormatter)
    sub.add_argument("--config_file", default=default_json_config_file, dest="save_location", help=_WHERE)
    sub.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], type=str, default="no",
                     help="mixed precision of the runs")
    sub.set_defaults(func=default_config_command)
    return sub


def default_config_command(args: argparse.Namespace) -> None:
    """Write the default config (unless the file exists) and say where."""
    written = write_basic_config(args.mixed_precision, args.save_location)
    if written:
        print(f"accelerate configuration saved at {written}")


def update_config(args: argparse.Namespace) -> str:
    """Rewrite a config file (Accelerate's default one when none is given) in the current layout; returns its path."""
    path = args.config_file
    if path is None and Path(default_config_file).exists():
        path = default_config_file
    elif path is None or not Path(path).exists():
        raise ValueError(f"The passed config file located at {path} doesn't exist; pass an existing --config_file.")
    _write(load_config_from_file(path), path)
    return path


def update_command_parser(parser: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `config update` sub-command under `parser` (the sub-parsers of `config`)."""
    description = "Rewrite an existing config file in the current layout, keeping its settings."
    sub = parser.add_parser("update", parents=parents, help=description, formatter_class=SubcommandHelpFormatter)
    sub.add_argument("--config_file", default=None, help="the config file to update (default: the default file)")
    sub.set_defaults(func=update_config_command)
    return sub


def update_config_command(args: argparse.Namespace) -> None:
    """Update the file and say which."""
    print(f"Successfully updated the configuration file at {update_config(args)}.")


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """`config` with its `default` and `update` sub-commands."""
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser = config_command_parser(subparsers)
    subcommands = parser.add_subparsers(title="subcommands", dest="subcommand")
    default_command_parser(subcommands, parents=[parent])
    update_command_parser(subcommands, parents=[parent])
    return parser


def main() -> None:
    """`accelerate-config`: the questionnaire, or `default` / `update`."""
    parser = get_config_parser()
    args = parser.parse_args()
    if not hasattr(args, "func"):
        parser.print_help()
        raise SystemExit(1)
    args.func(args)
