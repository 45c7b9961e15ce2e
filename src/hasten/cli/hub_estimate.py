"""Accelerate's `accelerate estimate-memory` (``accelerate.commands.estimate``): a Hub model's memory, built on `meta`.

The model named on the Hugging Face Hub is looked up (`verify_on_hub`),
built on the `meta` device by its library (transformers or timm), and
measured: per dtype, the largest layer, the total size and the memory to
train it with Adam at batch size 1, in Accelerate's rows and table. `hasten
estimate-memory` (`cli/estimate_memory.py`) is hasten's own, which also
reads local checkpoints and needs no Hub.

Example:
    >>> estimate_training_usage(400, "float32")
    {'model': 400, 'optimizer': 800, 'gradients': 400, 'step': 1600}
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from .recording_parser import CustomArgumentParser

__all__ = ["verify_on_hub", "check_has_model", "add_timm_hub_prefix", "create_empty_model", "create_ascii_table",
           "estimate_command_parser", "estimate_training_usage", "gather_data", "estimate_command", "main"]


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for `repo`; "gated" when it cannot be read (gated, or no connection), "repo" when absent.

    Example:
        >>> verify_on_hub  # doctest: +ELLIPSIS
        <function verify_on_hub at ...>
    """
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except RepositoryNotFoundError:
        return "repo"
    except (OSError, GatedRepoError):
        return "gated"


def check_has_model(error: BaseException) -> str:
    """Which library raised `error` because the repo has no model it can load: "timm", "transformers" or "unknown".

    Example:
        >>> check_has_model(KeyError("something else"))
        'unknown'
    """
    from ..core.availability import is_timm_available, is_transformers_available

    message = str(error)
    if is_timm_available():
        from huggingface_hub.utils import EntryNotFoundError

        if ((isinstance(error, RuntimeError) and "Unknown model" in message) or isinstance(error, EntryNotFoundError)
                or (isinstance(error, KeyError) and "architecture" in message)):
            return "timm"
    if is_transformers_available() and isinstance(error, (OSError, ValueError)) and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message):
        return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """The `hf-hub:` prefix timm needs for a Hub repo id; architecture names and prefixed names are left alone.

    Example:
        >>> add_timm_hub_prefix("timm/resnet50.a1_in1k"), add_timm_hub_prefix("resnet50")
        ('hf-hub:timm/resnet50.a1_in1k', 'resnet50')
    """
    return model_name if ":" in model_name or "/" not in model_name else f"hf-hub:{model_name}"


def _transformers_model(model_name: str, info: Any, trust_remote_code: bool, access_token: str | None) -> Any:
    import torch
    import transformers

    print(f"Loading pretrained config for `{model_name}` from `transformers`...")
    if info.config is None:
        raise RuntimeError(f"Tried to load `{model_name}` with `transformers` but it does not have any metadata.")
    auto_map = info.config.get("auto_map", False)
    config = transformers.AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code, token=access_token)
    constructor = transformers.AutoModel
    if isinstance(auto_map, dict):  # remote code may name its own Auto class
        name = next((key for key in auto_map if key.startswith("AutoModelFor")), None)
        if name is not None:
            constructor = getattr(transformers, name)
    # float32 explicitly: the config's own torch_dtype would otherwise be used
    return constructor.from_config(config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code)


def create_empty_model(model_name: str, library_name: str | None, trust_remote_code: bool = False,
                       access_token: str | None = None) -> Any:
    """The Hub model `model_name`, built in full precision on the `meta` device by its library."""
    from ..big_modeling.dispatch import init_empty_weights
    from ..core.availability import is_timm_available, is_transformers_available

    info = verify_on_hub(model_name, access_token)
    if info == "gated":
        raise OSError(f"Repo for model `{model_name}` is gated or could not be reached; log in with "
                      "`huggingface-cli login` (and check the connection).")
    if info == "repo":
        raise OSError(f"Repo for model `{model_name}` does not exist on the Hub; for a private repo, log in with "
                      "`huggingface-cli login` first.")
    if library_name is None:
        library_name = getattr(info, "library_name", None)
        if not library_name:
            raise ValueError(f"Model `{model_name}` does not have any library metadata on the Hub; pass "
                             "--library_name (such as `transformers`).")
    if library_name == "transformers":
        if not is_transformers_available():
            raise ImportError(f"To check `{model_name}`, `transformers` must be installed (pip install transformers).")
        with init_empty_weights():
            return _transformers_model(model_name, info, trust_remote_code, access_token)
    if library_name == "timm":
        if not is_timm_available():
            raise ImportError(f"To check `{model_name}`, `timm` must be installed (pip install timm).")
        timm = importlib.import_module("timm")
        print(f"Loading pretrained config for `{model_name}` from `timm`...")
        with init_empty_weights():
            return timm.create_model(add_timm_hub_prefix(model_name), pretrained=False)
    raise ValueError(f"Library `{library_name}` is not supported; use a transformers or timm model.")


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A box-drawn table of `rows` under `headers` and a centred `title`, every cell centred.

    Example:
        >>> print(create_ascii_table(["a", "b"], [["1", "2"]], "t"))
        ┌───┐
        │ t │
        ├─┬─┤
        │a│b│
        ├─┼─┤
        │1│2│
        └─┴─┘
    """
    widths = [max(len(str(cell)) for cell in [header, *(row[i] for row in rows)]) for i, header in enumerate(headers)]
    if len(title) > sum(widths):
        # Accelerate's geometry for a long title: the last column widens by twice the difference between the
        # title and the table's outer width (so its tables look the same here)
        widths[-1] += 2 * abs(len(title) - (sum(widths) + len(widths) + 1))
    inner = sum(widths) + len(widths) - 1

    def line(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * width for width in widths) + right

    def cells(values: list[str]) -> str:
        return "│" + "│".join(str(value).center(width) for value, width in zip(values, widths)) + "│"

    return "\n".join([f"┌{'─' * inner}┐", f"│{title.center(inner)}│", line("├", "┬", "┤"), cells(headers),
                      line("├", "┼", "┤"), *(cells(row) for row in rows), line("└", "┴", "┘")])


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `estimate-memory` parser: alone, or as a sub-command of `subparsers`.

    Example:
        >>> estimate_command_parser().parse_args(["bert-base-cased"]).dtypes
        ['float32', 'float16', 'int8', 'int4']
    """
    parser: Any = (subparsers.add_parser("estimate-memory") if subparsers is not None else CustomArgumentParser(
        description="Estimate the memory a Hub model needs on a device (e.g. cuda, xpu), per dtype."))
    parser.add_argument("model_name", type=str, help="the model's name on the Hugging Face Hub")
    parser.add_argument("--library_name", type=str, choices=["timm", "transformers"],
                        help="the model's library, when the Hub does not say")
    parser.add_argument("--dtypes", type=str, nargs="+", default=["float32", "float16", "int8", "int4"],
                        choices=["float32", "float16", "int8", "int4"], help="the dtypes to report")
    parser.add_argument("--trust_remote_code", action="store_true", default=False,
                        help="allow the model's own code from the Hub to run here (only for repos you trust)")
    if subparsers is not None:
        parser.set_defaults(func=estimate_command)
    return parser


def estimate_training_usage(bytes: int, mixed_precision: str) -> dict[str, int]:
    """Training memory at batch size 1 for a model of `bytes` in `mixed_precision` (-1: not estimated).

    Example:
        >>> estimate_training_usage(400, "float16")["gradients"]
        600
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    full, half = bytes, bytes // 2
    if mixed_precision == "float32":
        sizes.update(model=full, gradients=full, optimizer=full * 2, step=full * 4)
    elif mixed_precision in ("float16", "bfloat16", "fp8"):
        # weights kept in fp32 too; gradients: weight gradient plus half-precision compute
        sizes.update(model=full, gradients=full + half, optimizer=full * 2, step=full * 2)
    return sizes


_DIVISORS = {"float16": 2, "int8": 4, "int4": 8}


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Per dtype of `args.dtypes`: [dtype, largest layer, total size, training usage (a dict)], sizes in bytes."""
    from ..big_modeling.model_helpers import calculate_maximum_sizes

    try:
        model = create_empty_model(args.model_name, library_name=args.library_name,
                                   trust_remote_code=args.trust_remote_code)
    except (RuntimeError, OSError, ValueError, KeyError) as error:
        library = check_has_model(error)
        if library != "unknown":
            raise RuntimeError(f"Tried to load `{args.model_name}` with `{library}` but a possible model to load was "
                               "not found inside the repo.") from error
        raise
    total, (largest, _) = calculate_maximum_sizes(model)
    rows = []
    for dtype in args.dtypes:
        divisor = _DIVISORS.get(dtype, 1)
        training = estimate_training_usage(total, dtype)
        rows.append([dtype, largest / divisor if divisor > 1 else largest, total / divisor if divisor > 1 else total,
                     training])
    return rows


def estimate_command(args: argparse.Namespace) -> None:
    """Print the memory table of the model `args.model_name`."""
    from ..core.objects import convert_bytes

    rows = gather_data(args)
    for row in rows:
        for index, item in enumerate(row):
            if isinstance(item, dict):
                peak = max(item.values())
                row[index] = convert_bytes(peak) if peak != -1 else "N/A"
            elif isinstance(item, (int, float)):
                row[index] = convert_bytes(item)
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    print(create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`"))


def main() -> None:
    """`python -m` entry: parse the command line and print the table.

    Example:
        >>> main  # doctest: +ELLIPSIS
        <function main at ...>
    """
    estimate_command(estimate_command_parser().parse_args())
