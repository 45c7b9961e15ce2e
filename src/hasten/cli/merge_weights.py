"""`hasten merge-weights` (and the peer's `accelerate merge-weights`): a sharded FSDP checkpoint as one file."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("merge-weights", help="merge a sharded FSDP checkpoint into one model.safetensors")
    parser.add_argument("checkpoint_directory", help="a checkpoint saved by save_state, or its pytorch_model_fsdp_<i> directory")
    parser.add_argument("output_path", help="directory to write model.safetensors (or pytorch_model.bin) into")
    parser.add_argument("--unsafe_serialization", "--unsafe-serialization", action="store_true",
                        help="write a torch pickle (pytorch_model.bin) instead of safetensors")
    parser.add_argument("--remove_checkpoint_dir", "--remove-checkpoint-dir", action="store_true",
                        help="delete the sharded checkpoint afterwards")
    parser.set_defaults(run=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..strategies.fsdp.checkpoint import merge_fsdp_weights

    try:
        target = merge_fsdp_weights(args.checkpoint_directory, args.output_path,
                                    safe_serialization=not args.unsafe_serialization,
                                    remove_checkpoint_dir=args.remove_checkpoint_dir)
    except FileNotFoundError as error:
        args.parser.error(str(error))
    print(f"merged weights written to {target}")
    return 0


# -- the peer's `accelerate merge-weights` ----------------------------------------------------------------------------
def merge_command(args: argparse.Namespace) -> None:
    """Merge `args.checkpoint_directory` into `args.output_path` (safetensors unless `args.unsafe_serialization`)."""
    from ..strategies.fsdp.checkpoint import merge_fsdp_weights

    merge_fsdp_weights(args.checkpoint_directory, args.output_path, not args.unsafe_serialization,
                       args.remove_checkpoint_dir)


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `merge-weights` parser: alone, or as a sub-command of `subparsers`.

    Example:
        >>> merge_command_parser().parse_args(["ckpt", "out"]).unsafe_serialization
        False
    """
    from .recording_parser import CustomArgumentParser

    description = ("Merge the weights of a sharded FSDP checkpoint (SHARDED_STATE_DICT) into one file in "
                   "`output_path`; the whole model is loaded into CPU memory to do it.")
    parser: Any = (subparsers.add_parser("merge-weights", description=description) if subparsers is not None
                   else CustomArgumentParser(description=description))
    parser.add_argument("checkpoint_directory", type=str, help="a folder of weights sharded by FSDP")
    parser.add_argument("output_path", type=str, help="the folder to write the merged weights into")
    parser.add_argument("--unsafe_serialization", action="store_true", default=False,
                        help="write a pickle (.bin) instead of safetensors (not recommended)")
    parser.add_argument("--remove_checkpoint_dir", action="store_true", default=False,
                        help="remove the sharded checkpoint folder after merging")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def main() -> None:
    """`python -m` entry of the peer's command.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    merge_command(merge_command_parser().parse_args())
