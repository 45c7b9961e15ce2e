"""What `accelerate launch` tests start: prints how many accelerators the launched process sees.

Example (as a launched script):
    $ hasten launch src/hasten/test_utils/scripts/test_cli.py
    Successfully ran on 0 GPUs
"""

from __future__ import annotations


def main() -> None:
    """Print the number and kind of accelerator devices visible to this process (GPUs, or Intel XPUs)."""
    import torch

    kind, count = "GPU", 0
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
    elif getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        kind, count = "XPU", torch.xpu.device_count()
    print(f"Successfully ran on {count} {kind}s")


if __name__ == "__main__":
    main()
