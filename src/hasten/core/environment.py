"""Reading and patching environment variables (the peer's path is ``accelerate.utils.environment``).

Example:
    >>> import os
    >>> from hasten.core.environment import patch_environment
    >>> with patch_environment(my_setting="1"):
    ...     os.environ["MY_SETTING"]
    '1'
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

__all__ = ["clear_environment", "convert_dict_to_env_variables", "get_int_from_env", "parse_choice_from_env",
           "parse_flag_from_env", "patch_environment", "str_to_bool"]


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 for y/yes/t/true/on/1, 0 for n/no/f/false/off/0 (a bool with `to_bool=True`).

    Example:
        >>> str_to_bool("Yes"), str_to_bool("off", to_bool=True)
        (1, False)
    """
    value = value.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True if to_bool else 1
    if value in ("n", "no", "f", "false", "off", "0"):
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}; use one of yes/no, true/false, on/off, 1/0.")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of `env_keys` set to a non-negative integer, else `default`.

    Example:
        >>> get_int_from_env(["SURELY_UNSET_VARIABLE"], 3)
        3
    """
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The boolean value of environment variable `key` (`default` when unset).

    Example:
        >>> parse_flag_from_env("SURELY_UNSET_VARIABLE", default=True)
        True
    """
    return bool(str_to_bool(os.environ.get(key, str(default)), to_bool=True))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The value of environment variable `key`, or `default`.

    Example:
        >>> parse_choice_from_env("SURELY_UNSET_VARIABLE", "bf16")
        'bf16'
    """
    return os.environ.get(key, str(default))


def convert_dict_to_env_variables(current_env: dict[str, Any]) -> list[str]:
    """`KEY=value` lines for each entry (entries with empty keys or values are skipped).

    Example:
        >>> convert_dict_to_env_variables({"A": 1, "B": ""})
        ['A=1\\n']
    """
    return [f"{key}={value}\n" for key, value in current_env.items() if key and str(value)]


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty `os.environ`, restored afterwards.

    Example:
        >>> with clear_environment():
        ...     len(os.environ)
        0
    """
    with restored_environment():
        os.environ.clear()
        yield


@contextlib.contextmanager
def restored_environment() -> Iterator[None]:
    """Afterwards `os.environ` is exactly as before the block, whatever the block (or a library in it) changed.

    Example:
        >>> with restored_environment():
        ...     os.environ["MY_PROBE_VARIABLE"] = "1"
        >>> "MY_PROBE_VARIABLE" in os.environ
        False
    """
    saved = os.environ.copy()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (names upper-cased, values str()) for the block; restore the old values after.

    Example:
        >>> with patch_environment(master_port=29501):
        ...     os.environ["MASTER_PORT"]
        '29501'
    """
    saved: dict[str, str | None] = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
