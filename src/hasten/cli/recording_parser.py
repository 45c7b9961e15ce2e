"""The argument parser of Accelerate's commands (``accelerate.commands.utils``): either spelling, and what was given.

Every option of an `accelerate` command takes hyphens or underscores alike
(`--num-processes` is `--num_processes`); help lists the underscore
spelling only. Each option given on the command line is recorded in the
namespace's `nondefault` set, which `accelerate launch` uses to let the
command line win over the config file.

Example:
    >>> parser = CustomArgumentParser(prog="demo")
    >>> parser.add_argument("--num_processes", type=int)
    >>> args = parser.parse_args(["--num-processes", "2"])
    >>> args.num_processes, args.nondefault
    (2, {'num_processes'})
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["CustomArgumentParser", "CustomArgumentGroup", "CustomHelpFormatter", "_StoreAction", "_StoreConstAction",
           "_StoreTrueAction", "SwitchAction"]


def _spellings(option_strings: list[str]) -> list[str]:
    """The option strings with the hyphenated spelling of every ``--long_name`` added after it."""
    out: list[str] = []
    for option in option_strings:
        for spelling in (option, option.replace("_", "-") if option.startswith("--") else option):
            if spelling not in out:
                out.append(spelling)
    return out


class _StoreAction(argparse.Action):
    """Store the value, and record the option's destination in ``namespace.nondefault``.

    Example:
        >>> _StoreAction(["--log_dir"], "log_dir").option_strings
        ['--log_dir', '--log-dir']
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(_spellings(list(option_strings)), dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        if not hasattr(namespace, "nondefault"):
            namespace.nondefault = set()
        namespace.nondefault.add(self.dest)


class _StoreConstAction(_StoreAction):
    """`store_const` with the recording of `_StoreAction`.

    Example:
        >>> _StoreConstAction(["--tpu_cluster"], "tpu_use_cluster", const=True).nargs
        0
    """

    def __init__(self, option_strings: list[str], dest: str, const: Any, default: Any = None, required: bool = False,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, required=required, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, self.const, option_string)


class _StoreTrueAction(_StoreConstAction):
    """`store_true` with the recording of `_StoreAction`.

    Example:
        >>> _StoreTrueAction(["--cpu"], "cpu", default=False).const
        True
    """

    def __init__(self, option_strings: list[str], dest: str, default: Any = None, required: bool = False,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, const=True, default=default, required=required, help=help)


class SwitchAction(_StoreAction):
    """A yes/no option: ``--name`` stores True, ``--no-name`` (any spelling starting ``--no-``) stores False.

    Absent, it holds its default (False, as Accelerate's store_true options);
    given either way, it is recorded in ``nondefault``, so ``--no-cpu`` can
    turn off what a config file turned on.

    Example:
        >>> parser = CustomArgumentParser(prog="demo")
        >>> parser.add_argument("--cpu", "--no-cpu", action=SwitchAction, default=False)
        >>> args = parser.parse_args(["--no-cpu"])
        >>> args.cpu, args.nondefault
        (False, {'cpu'})
    """

    def __init__(self, option_strings: list[str], dest: str, default: Any = False, required: bool = False,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, required=required, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, not (option_string or "").startswith("--no-"), option_string)


def _ours(action: argparse.Action) -> argparse.Action:
    """The recording counterpart of a stock store / store_const / store_true action."""
    if isinstance(action, _StoreAction):
        return action
    settings = vars(action)
    if isinstance(action, argparse._StoreTrueAction):
        return _StoreTrueAction(list(action.option_strings), action.dest, action.default, action.required, action.help)
    if isinstance(action, argparse._StoreConstAction):
        return _StoreConstAction(list(action.option_strings), action.dest, action.const, action.default,
                                 action.required, action.help)
    if isinstance(action, argparse._StoreAction):
        return _StoreAction(**{key: value for key, value in settings.items() if key != "container"})
    return action


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose store actions take either spelling and record what was given.

    Example:
        >>> parser = CustomArgumentParser(prog="demo")
        >>> group = parser.add_argument_group("resources")
        >>> _ = group.add_argument("--gpu_ids")
        >>> parser.parse_args(["--gpu-ids", "0"]).gpu_ids
        '0'
    """

    def _add_action(self, action: Any) -> Any:
        return super()._add_action(_ours(action))


class CustomHelpFormatter(argparse.HelpFormatter):
    """Help that shows each option once, in its underscore spelling.

    Example:
        >>> parser = CustomArgumentParser(prog="demo", formatter_class=CustomHelpFormatter)
        >>> parser.add_argument("--num_processes", type=int)
        >>> "--num-processes" in parser.format_help()
        False
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap  # an option's name (`--num-processes`) is never cut at a hyphen

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        seen: set[str] = set()  # a spelling is shown unless it is the hyphenated twin of one shown before it
        shown = []
        for option in action.option_strings:
            canonical = "--" + option[2:].replace("-", "_") if option.startswith("--") else option
            if canonical not in seen:
                shown.append(option)
            seen.add(canonical)
        if not action.option_strings or shown == action.option_strings:
            return super()._format_action_invocation(action)
        copy = argparse.Action.__new__(type(action))
        copy.__dict__.update(vars(action), option_strings=shown)
        return super()._format_action_invocation(copy)


class CustomArgumentParser(argparse.ArgumentParser):
    """Accelerate's command parser: store options take either spelling and are recorded in ``nondefault``.

    A `store_true` option given no default is None when absent, as in Accelerate.

    Example:
        >>> parser = CustomArgumentParser(prog="demo")
        >>> parser.add_argument("--cpu", action="store_true")
        >>> parser.parse_args([]).cpu, parser.parse_args(["--cpu"]).cpu
        (None, True)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", CustomHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        action = kwargs.get("action")
        if action is None:
            kwargs["action"] = _StoreAction
        elif action == "store_true":
            kwargs["action"] = _StoreTrueAction
        super().add_argument(*args, **kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group
