"""The gated MLP of Llama/Qwen layers and of the DFlash drafter."""

from __future__ import annotations

import torch
from torch import nn


class SwiGLU(nn.Module):
    # True: `silu(gate) * up` in one Triton launch (blockspec.layers.triton_ops); set by
    # blockspec.layers.fused.enable_fused_ops.
    fused: bool = False

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            from blockspec.layers import triton_ops
            return self.down_proj(triton_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
