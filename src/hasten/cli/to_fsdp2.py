"""`hasten to-fsdp2`: rewrite an FSDP1 config file (`accelerate config` / `hasten config`) for FSDP2.

The peer's ``accelerate to-fsdp2``, with its flags and its mapping: keys FSDP2
keeps are carried over, `fsdp_sharding_strategy` becomes
`fsdp_reshard_after_forward` (FULL_SHARD / HYBRID_SHARD -> true, the others ->
false), `fsdp_backward_prefetch`, `fsdp_sync_module_states` and
`fsdp_use_orig_params` are dropped (FSDP2 has no such settings) and
`fsdp_forward_prefetch` is dropped as not yet implemented, each with a
warning; keys it does not know are kept; `fsdp_version` becomes 2. One
addition: a sharding strategy written as a number by very old files (2 =
SHARD_GRAD_OP) is mapped as its name, where the peer would copy the number.
The warnings go to this module's logger, as the peer's do; `hasten to-fsdp2`
prints them as its own lines.

Example:
    >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}})
    {'fsdp_config': {'fsdp_reshard_after_forward': False, 'fsdp_version': 2}}
"""

from __future__ import annotations

import argparse
import enum
import logging
import sys
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError

__all__ = ["ARGUMENT_KEY_MAPPING", "ARGUMENT_VALUE_MAPPING", "ConversionStatus", "add_parser",
           "convert_config_to_fsdp2", "load_config", "logger", "main", "to_fsdp2_command", "to_fsdp2_command_parser"]


class ConversionStatus(enum.Enum):
    """What becomes of an FSDP1 key that has no FSDP2 counterpart.

    Example:
        >>> ARGUMENT_KEY_MAPPING["fsdp_use_orig_params"]
        <ConversionStatus.REMOVED: -1>
    """

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# FSDP1 key -> its FSDP2 key, or why it is dropped (the peer's table, key for key).
ARGUMENT_KEY_MAPPING: dict[str, str | ConversionStatus] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

# A sharding strategy says whether parameters are resharded after forward (ZeRO-3 like) or kept (ZeRO-2 like).
_RESHARDS = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False,
             "NO_SHARD": False}
ARGUMENT_VALUE_MAPPING: dict[str, dict[Any, Any]] = {
    "fsdp_sharding_strategy": dict(_RESHARDS),
    "fsdp_reshard_after_forward": dict(_RESHARDS),  # files written for FSDP1 with the FSDP2 key name
}


logger = logging.getLogger(__name__)


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the `fsdp_config` of a loaded config file for FSDP2 (in place; also returned).

    A file without `fsdp_config`, or one that already says `fsdp_version:
    2`, comes back unchanged (the latter with a warning, as the peer).

    Example:
        >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_use_orig_params": True}})["fsdp_config"]
        {'fsdp_version': 2}
    """
    from ..launch.config_migration import FSDP_SHARDING_BY_NUMBER

    fsdp_config = config.get("fsdp_config") or {}
    if not fsdp_config:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if fsdp_config.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion... (fsdp_version: 2: the file is written "
                       "unchanged; if it still uses FSDP1 key names, set fsdp_version: 1 and rerun.)")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp_config.items():
        target = ARGUMENT_KEY_MAPPING.get(key)
        if target is None:  # a key the table does not know is carried over as it is
            converted[key] = value
        elif target is ConversionStatus.REMOVED:
            logger.warning(f"{key} has been removed in FSDP2; dropped it.")
        elif target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning(f"{key} is not yet implemented in FSDP2; dropped it.")
        else:
            if key == "fsdp_sharding_strategy" and type(value) is int:  # very old files: the enum's number
                value = FSDP_SHARDING_BY_NUMBER.get(value, value)
            if key in ARGUMENT_VALUE_MAPPING:
                value = ARGUMENT_VALUE_MAPPING[key].get(value, value)
            converted[str(target)] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str | Path) -> dict[str, Any]:
    """Read a YAML config file; an empty one is refused.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = path.write_text("num_processes: 2\\n")
        >>> load_config(path)
        {'num_processes': 2}
    """
    import yaml

    with open(config_file) as handle:
        config = yaml.safe_load(handle)
    if not config:
        raise ConfigError(f"config file {config_file} is empty; pass a file written by `accelerate config` or "
                          "`hasten config`.")
    if not isinstance(config, dict):
        raise ConfigError(f"config file {config_file} holds a {type(config).__name__}, not a mapping of keys to "
                          "values; pass a file written by `accelerate config` or `hasten config`.")
    return config


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert `args.config_file` and write it to `args.output_file` (or over itself with `args.overwrite`).

    Raises FileNotFoundError, ValueError or FileExistsError, each in one
    sentence, as the peer's command does.

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "fsdp1.yaml").write_text("fsdp_config:\\n  fsdp_sharding_strategy: FULL_SHARD\\n")
        >>> to_fsdp2_command(argparse.Namespace(config_file=str(folder / "fsdp1.yaml"),
        ...                                     output_file=str(folder / "fsdp2.yaml"), overwrite=False))
        >>> print((folder / "fsdp2.yaml").read_text(), end="")
        fsdp_config:
          fsdp_reshard_after_forward: true
          fsdp_version: 2
    """
    import yaml

    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"config file {args.config_file} not found; pass the path of an FSDP1 config file "
                                "with --config_file.")
    if not args.overwrite and args.output_file is None:
        raise ConfigError("pass --output_file PATH to write the converted config there, or --overwrite to replace "
                          "the config file in place.")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(f"output file {args.output_file} already exists; pass --overwrite to replace it, or "
                              "another --output_file.")
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    output = args.config_file if args.output_file is None else args.output_file
    with open(output, "w") as handle:
        yaml.safe_dump(converted, handle)  # the peer's yaml.dump layout: sorted keys, block style


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `to-fsdp2` parser: under `subparsers` (a sub-command) or alone, as the peer's.

    Example:
        >>> to_fsdp2_command_parser().parse_args(["--config_file", "a.yaml", "--overwrite"]).overwrite
        True
    """
    from .parsing import ConciseParser

    description = "Convert an FSDP1 config file (accelerate config / hasten config) to FSDP2."
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", help="convert an FSDP1 config file to FSDP2",
                                       description=description)
    else:
        parser = ConciseParser(prog="hasten to-fsdp2", description=description)
    parser.add_argument("--config_file", "--config-file", required=True, help="the config file to convert to FSDP2")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the output file if it exists (the config file itself without --output_file)")
    parser.add_argument("--output_file", "--output-file", default=None,
                        help="where to write the converted config; without it, --overwrite rewrites --config_file")
    parser.set_defaults(run=run, parser=parser, func=to_fsdp2_command)
    return parser


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register `hasten to-fsdp2` among the sub-commands.

    Example:
        >>> from hasten.cli.main import build_parser
        >>> build_parser().parse_args(["to-fsdp2", "--config_file", "a.yaml", "--overwrite"]).command
        'to-fsdp2'
    """
    return to_fsdp2_command_parser(commands)


def run(args: argparse.Namespace) -> int:
    """Run the parsed `hasten to-fsdp2`; a bad path or flag is one sentence and exit code 2."""
    handler = logging.StreamHandler(sys.stderr)  # the conversion's warnings, as this command's own lines
    handler.setFormatter(logging.Formatter("hasten to-fsdp2: warning: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        to_fsdp2_command(args)
    except (OSError, ValueError) as error:
        args.parser.error(str(error))
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    print(f"FSDP2 config written to {args.output_file or args.config_file}")
    return 0


def main() -> None:
    """`python -m` entry of the peer's command: parse the command line and convert.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    to_fsdp2_command(to_fsdp2_command_parser().parse_args())
