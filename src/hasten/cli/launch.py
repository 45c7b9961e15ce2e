"""`hasten launch`: start a training script as the flags and the config file say (the launch command's shell front).

The command is one: its flags (`launch_flags`, every flag of `accelerate
launch` plus hasten's), its resolution of flags + config file
(`launch_settings`) and its plan (`launch_build`) are the ones `accelerate
launch` runs under the switch (`launchers`). This front presents the
outcome for a shell: a refused launch is one line and exit 2, a failed run
its rank's exit code, and a one-process run runs in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..launch.config import ConfigError
from ..process.launch_spec import AS_ACCELERATE_ENV
from .launch_build import build_plan as _build_plan, deepspeed_runs_itself, print_notes, switch_env, unused_settings
from .launch_flags import DESCRIPTION, add_launch_arguments
from .launch_settings import ResolvedLaunch, resolve_config
from .recording_parser import CustomHelpFormatter

__all__ = ["add_parser", "launch_parser", "resolve_config", "build_plan", "unused_settings", "run", "main"]


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add `launch` to `hasten`'s sub-commands.

    Example:
        >>> from hasten.cli.parsing import ConciseParser
        >>> parser = ConciseParser(prog="hasten")
        >>> launch = add_parser(parser.add_subparsers(dest="command"))
        >>> launch.parse_args(["--num-processes", "2", "train.py"]).num_processes
        2
    """
    parser = commands.add_parser(
        "launch",
        help="start a training script on 1 or N processes, on 1 or N machines",
        description=DESCRIPTION,
        formatter_class=_Formatter,
        add_help=False,
        allow_abbrev=False,  # `script.py --start 1`: the script's own flags are never prefixes of launcher options
    )
    add_launch_arguments(parser)
    parser.set_defaults(run=run, parser=parser)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter, CustomHelpFormatter):
    """Each option once (its underscore spelling), the description's paragraphs as written."""


def launch_parser() -> argparse.ArgumentParser:
    """`hasten launch`'s parser alone (as `hasten` builds it).

    Example:
        >>> launch_parser().parse_args(["--tee", "3", "train.py"]).tee
        '3'
    """
    from .parsing import ConciseParser

    return add_parser(ConciseParser(prog="hasten").add_subparsers(dest="command", parser_class=ConciseParser))


def build_plan(args: argparse.Namespace, resolved: ResolvedLaunch) -> Any:
    """The `LaunchPlan` `hasten launch` runs for `resolved` (a one-process run in this process)."""
    extra = switch_env() if args.as_accelerate or os.environ.get(AS_ACCELERATE_ENV) == "1" else {}
    return _build_plan(args, resolved, in_this_process=True, extra_env=extra)


def run(args: argparse.Namespace) -> int:
    """Run `hasten launch` for parsed arguments; returns the exit code for the shell."""
    from ..launch.plan import LaunchError
    from .launcher_env import run_deepspeed_itself

    switch = bool(args.as_accelerate or os.environ.get(AS_ACCELERATE_ENV) == "1")
    try:
        resolved = resolve_config(args)
        if deepspeed_runs_itself(resolved.config):
            return run_deepspeed_itself(args, resolved, switch=switch)
        plan = build_plan(args, resolved)
    except (ConfigError, LaunchError, ImportError) as error:
        sys.stderr.write(f"hasten launch: error: {error}\n")
        return 2
    if not args.quiet:
        print_notes(resolved, "hasten launch")
    if args.dry_run:
        print(plan.describe())
        return 0
    if switch:
        from ..process.aliasing import install

        install()  # here first: a single process runs the script in this one; the workers inherit PYTHONPATH
    from ..launch.run import execute

    return execute(plan)


def main(argv: list[str]) -> int:
    """`hasten launch ARGV...` as a function (what `hasten test` calls); returns the process exit code.

    Example:
        >>> _ = open("train.py", "w").write("print('hello')")
        >>> main(["--dry_run", "--cpu", "--num_processes", "1", "train.py"])  # doctest: +ELLIPSIS
        HASTEN_LAUNCH_SPEC=... -m hasten.launch.worker train.py
        0
    """
    from .parsing import ConciseParser, run_command

    parser = ConciseParser(prog="hasten")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ConciseParser))
    return run_command(parser, ["launch", *argv])
