"""Accelerate's ``accelerate.commands.estimate`` path: `accelerate estimate-memory`; the code is `hasten.cli.hub_estimate`.

Example:
    >>> from hasten.commands.estimate import estimate_command_parser
    >>> estimate_command_parser().parse_args(["bert-base-cased", "--dtypes", "float16"]).dtypes
    ['float16']
"""

from ..cli.hub_estimate import (add_timm_hub_prefix, check_has_model, create_ascii_table, create_empty_model,
                                estimate_command, estimate_command_parser, estimate_training_usage, gather_data, main,
                                verify_on_hub)

__all__ = ["add_timm_hub_prefix", "check_has_model", "create_ascii_table", "create_empty_model", "estimate_command",
           "estimate_command_parser", "estimate_training_usage", "gather_data", "main", "verify_on_hub"]


if __name__ == "__main__":  # python -m accelerate.commands.estimate, under the switch
    main()
