"""Accelerate's SageMaker launch helpers (``accelerate.utils.launch``): hyperparameters parsed, jobs refused.

hasten starts no Amazon SageMaker job (`accelerate launch` with a SageMaker
config is refused in one sentence); what remains is Accelerate's reading of
a script's arguments as SageMaker hyperparameters.

Example:
    >>> _convert_nargs_to_dict(["--epochs", "3", "--lr", "0.5", "--name", "run", "--fast", "True"])
    {'epochs': 3, 'lr': 0.5, 'name': 'run', 'fast': True}
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["_convert_nargs_to_dict", "prepare_sagemager_args_inputs"]


def _number_or_text(text: str) -> Any:
    """An int for a whole number, a float for another number, else the text."""
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """A script's `--name value` arguments as a dict of typed values ("True"/"False" as booleans).

    A flag without a value (a `store_true` option) cannot be a SageMaker
    hyperparameter and is refused.
    """
    parser = argparse.ArgumentParser()
    _, unknown = parser.parse_known_args(nargs)
    for index, argument in enumerate(unknown):
        if not argument.startswith("-"):
            continue
        if index + 1 >= len(unknown) or unknown[index + 1].startswith("-"):
            raise ValueError("SageMaker doesn’t support argparse actions for `store_true` or `store_false`; give "
                             f"{argument} an explicit value (e.g. `{argument} True`).")
        parser.add_argument(argument, type=_number_or_text)
    return {key: {"True": True, "False": False}.get(value, value) if isinstance(value, str) else value
            for key, value in vars(parser.parse_args(nargs)).items()}


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Refused: hasten starts no Amazon SageMaker job (Accelerate's builds the estimator's arguments here).

    Example:
        >>> prepare_sagemager_args_inputs(None, argparse.Namespace())
        Traceback (most recent call last):
        ...
        NotImplementedError: hasten does not start Amazon SageMaker jobs; launch inside the job with a LOCAL_MACHINE config instead.
    """
    raise NotImplementedError("hasten does not start Amazon SageMaker jobs; launch inside the job with a LOCAL_MACHINE "
                              "config instead.")
