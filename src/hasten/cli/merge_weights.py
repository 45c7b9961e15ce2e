"""`hasten merge-weights`: turn a sharded FSDP checkpoint into one safetensors file."""

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
