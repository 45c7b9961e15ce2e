"""`hasten launch`: start a training script on 1 or N processes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..launch_spec import MIXED_PRECISION_CHOICES

DESCRIPTION = """\
Start SCRIPT (or -m MODULE) on --num_processes processes of this machine.
Process start and rendezvous are torch.distributed.run's; the settings
below reach every process as one launch spec, which Accelerator() reads.
"""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "launch",
        help="start a training script on 1 or N processes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--num_processes", "--num-processes", type=int, default=1, metavar="N",
                        help="processes to start on this machine (default: 1)")
    parser.add_argument("--cpu", action="store_true", help="compute on the CPU even if GPUs are present")
    parser.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISION_CHOICES, default=None,
                        help="mixed precision for every process (default: the script's own choice, else 'no')")
    parser.add_argument("--gradient_accumulation_steps", "--gradient-accumulation-steps", type=int, default=None,
                        metavar="K", help="default gradient accumulation steps for Accelerator()")
    parser.add_argument("--main_process_ip", "--main-process-ip", default="127.0.0.1", metavar="ADDR",
                        help="address the rendezvous listens on (default: 127.0.0.1, loopback only)")
    parser.add_argument("--main_process_port", "--main-process-port", type=int, default=None, metavar="PORT",
                        help="rendezvous port (default: a free port)")
    parser.add_argument("--debug", action="store_true", help="check tensor shapes across ranks before collectives")
    parser.add_argument("--dry_run", "--dry-run", action="store_true", help="print the command and launch spec, start nothing")
    parser.add_argument("-m", "--module", action="store_true", help="treat SCRIPT as a Python module name")
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="arguments passed to the script")
    parser.set_defaults(run=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..launch.plan import LaunchError, LaunchPlan
    from ..launch_spec import LaunchSpec

    if args.gradient_accumulation_steps is not None and args.gradient_accumulation_steps < 1:
        return _refuse(f"--gradient_accumulation_steps must be at least 1, got {args.gradient_accumulation_steps}.")
    try:
        plan = LaunchPlan(
            target=args.script,
            target_args=tuple(args.script_args),
            module=args.module,
            num_processes=args.num_processes,
            main_process_ip=args.main_process_ip,
            main_process_port=args.main_process_port,
            spec=LaunchSpec(
                mixed_precision=args.mixed_precision,
                cpu=args.cpu,
                debug=args.debug,
                gradient_accumulation_steps=args.gradient_accumulation_steps,
            ),
        ).validate()
    except LaunchError as error:
        return _refuse(str(error))
    if args.dry_run:
        print(plan.describe())
        return 0
    from ..launch.run import execute

    return execute(plan)


def _refuse(message: str) -> int:
    sys.stderr.write(f"hasten launch: error: {message}\n")
    return 2
