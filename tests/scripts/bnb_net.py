"""The model the bitsandbytes tests quantize (tests/scripts/bnb_peer.py under both libraries, tests/test_big_model_bnb.py).

A small language-model shape: an embedding tied to the head, two Linear blocks, an attention-like module, a norm.
"""

import torch
from torch import nn


class Net(nn.Module):
    """A small language-model shape: embedding tied to the head, blocks, an attention-like module, a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 64)
        self.blocks = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
        self.attn = nn.Module()
        self.attn.q = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.attn.q(self.blocks(self.embed(ids)))))


def net() -> Net:
    torch.manual_seed(0)
    return Net()
