"""The gated MLP of Llama/Qwen layers and of the DFlash drafter."""

from __future__ import annotations

import torch
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
