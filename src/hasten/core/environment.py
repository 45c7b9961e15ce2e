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
import functools
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar, cast


__all__ = ["CPUInformation", "are_libraries_initialized", "clear_environment", "convert_dict_to_env_variables",
           "get_cpu_distributed_information", "get_current_device_type", "get_int_from_env", "parse_choice_from_env",
           "parse_flag_from_env", "patch_environment", "purge_accelerate_environment", "str_to_bool"]

_T = TypeVar("_T")
# Characters that would break the `KEY=value` lines of an environment file (or a shell reading them).
_FORBIDDEN_IN_ENV_LINES = (";", "\n", "<", ">", " ")


def _logger() -> logging.Logger:
    """Under the accelerate switch, Accelerate's logger name for this module, so code listening to it hears us."""
    switched = getattr(sys.modules.get("accelerate"), "__name__", None) == "hasten"
    return logging.getLogger("accelerate.utils.environment" if switched else __name__)


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
    """`KEY=value` lines for each entry; an entry with an empty key or value, or holding ``; < >``, a space or a
    newline, is skipped with a warning (as Accelerate's).

    Example:
        >>> convert_dict_to_env_variables({"A": 1, "B": "", "C": "x y"})
        ['A=1\\n']
    """
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and str(value) and not any(char in text for char in _FORBIDDEN_IN_ENV_LINES):
            lines.append(f"{key}={value}\n")
        else:
            _logger().warning(f"Skipping {key}={value}: an environment line needs a key and a value, without ';', "
                              "'<', '>', spaces or newlines; fix the value to keep it.")
    return lines


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


_PURGE_MARK = "__hasten_purges_accelerate_environment__"


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def purged(*args: Any, **kwargs: Any) -> Any:
        saved = {key: value for key, value in os.environ.items() if key.startswith("ACCELERATE_")}
        try:
            return function(*args, **kwargs)
        finally:
            for key in [key for key in os.environ if key.startswith("ACCELERATE_") and key not in saved]:
                del os.environ[key]
            os.environ.update(saved)

    setattr(purged, _PURGE_MARK, True)
    return purged


def _purge_tests_of(cls: type) -> None:
    for name in dir(cls):
        method = getattr(cls, name)
        if name.startswith("test") and callable(method) and not getattr(method, _PURGE_MARK, False):
            setattr(cls, name, _purging(method))


def purge_accelerate_environment(func_or_cls: _T) -> _T:
    """Decorator: after the function (or each ``test*`` method of the class and of its subclasses) the
    ``ACCELERATE_*`` environment variables are as they were before it: new ones removed, changed ones restored.

    Libraries set such variables and leave them (transformers' `TrainingArguments(fp16=True)` sets
    ``ACCELERATE_MIXED_PRECISION``), which then steer later code; decorate a test or test class with this to keep
    tests apart. Works on `unittest.TestCase` and plain pytest classes, under their skip and fixture marks.

    Example:
        >>> @purge_accelerate_environment
        ... def configure():
        ...     os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        >>> configure()
        >>> "ACCELERATE_MIXED_PRECISION" in os.environ
        False
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)  # type: ignore[arg-type,return-value]
    cls = cast(type, func_or_cls)
    _purge_tests_of(cls)
    own = cls.__dict__.get("__init_subclass__")

    def init_subclass(subclass: type, **kwargs: Any) -> None:
        if own is not None:
            own.__func__(subclass, **kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)  # type: ignore[misc,arg-type]
        _purge_tests_of(subclass)

    cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment,method-assign]
    return func_or_cls


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among `library_names` that this process has already imported.

    Example:
        >>> are_libraries_initialized("os", "surely_not_a_module")
        ['os']
    """
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of the accelerator torch reports, found without initialising it:
    ``("cpu", "NO")`` on a machine without one, ``("cuda", "MULTI_GPU")`` with CUDA, ``(type, "MULTI_TYPE")`` for
    another accelerator with a distributed backend, ``(type, "NO")`` for one without (Accelerate 1.16's answer).

    Example:
        >>> device_type, distributed_type = get_current_device_type()
        >>> distributed_type == "NO" or distributed_type.startswith("MULTI_")
        True
    """
    from .accelerators import get_distributed_backend, get_torch_accelerator_backend

    device_type, _ = get_torch_accelerator_backend(check_available=False)
    if device_type is None:
        return "cpu", "NO"
    if get_distributed_backend(device_type) is None:
        return device_type, "NO"
    return device_type, "MULTI_GPU" if device_type == "cuda" else f"MULTI_{device_type.upper()}"


@dataclass
class CPUInformation:
    """Where this process stands among the processes of a CPU run (`get_cpu_distributed_information`).

    Example:
        >>> CPUInformation(rank=1, world_size=2).local_world_size
        1
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    """Rank, world size, local rank and local world size from torchrun's, Intel MPI's / MPICH's, Open MPI's or
    MVAPICH's variables (the first set), else a single process.

    Example:
        >>> with patch_environment(RANK=3, WORLD_SIZE=4):
        ...     get_cpu_distributed_information().rank
        3
    """
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )
