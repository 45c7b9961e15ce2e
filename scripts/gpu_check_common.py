"""The prelude every `gpu_check.py` section starts with: the device, `result`, `sync`, a test MLP."""

COMMON = """
import json, time, torch, statistics
from torch import nn
def result(**kw): print("RESULT " + json.dumps(kw), flush=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # a dry run on a CPU machine checks the code, not the GPU
def sync(): torch.cuda.synchronize() if DEV == "cuda" else None
BIG = DEV == "cuda"  # sizes for a GPU; a CPU dry run uses small ones
def mlp(width=None, depth=6):
    width = width if BIG or width is None else min(width, 256)
    width = width or (2048 if BIG else 256)
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 1))
"""
