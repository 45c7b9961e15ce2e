"""`hasten estimate-memory MODEL`: size, largest layer and training memory per dtype, without reading weights."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "estimate-memory",
        help="memory a model needs per dtype (load, train with Adam, per rank under FSDP/ZeRO-3)",
        description="Read a model's tensor list from its safetensors headers, or build it on the meta device, and "
                    "print its size, largest layer and Adam training memory per dtype. No weights are read.",
    )
    parser.add_argument("model_name", metavar="MODEL",
                        help="a model folder or safetensors file/index, a transformers config (folder, config.json or "
                             "cached hub name), or module.path:ClassName (built with no arguments)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8", "int4"],
                        help="dtypes to report: float32/fp32, float16/fp16, bfloat16/bf16, int8, int4")
    parser.add_argument("--num_processes", "--num-processes", type=int, default=8,
                        help="ranks to divide training memory over for the FSDP/ZeRO-3 column (default 8)")
    parser.add_argument("--library_name", "--library-name", choices=["transformers"], default=None,
                        help="accepted for compatibility: hasten reads transformers configs and safetensors headers")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true",
                        help="allow a transformers config to run the model code it names")
    parser.set_defaults(run=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..big_modeling.estimate import estimate_memory, format_estimate, model_tensors

    try:
        tensors = model_tensors(args.model_name, trust_remote_code=args.trust_remote_code)
        estimates = estimate_memory(tensors, args.dtypes, args.num_processes)
    except ValueError as error:
        args.parser.error(str(error))
    print(format_estimate(args.model_name, tensors, estimates, args.num_processes))
    return 0
