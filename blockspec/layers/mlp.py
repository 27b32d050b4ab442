"""The gated MLP of Llama/Qwen layers and of the DFlash drafter."""

from __future__ import annotations

import torch
from torch import nn

from blockspec.layers.linear import MergedLinear


class SwiGLU(nn.Module):
    # True: `silu(gate) * up` in one Triton launch (blockspec.layers.triton_ops); set by
    # blockspec.layers.fused.enable_fused_ops.
    fused: bool = False

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.gate_up_proj: MergedLinear | None = None

    def merge_projections(self) -> None:
        """gate and up as one product (see layers/linear.py); the separate layers are dropped."""
        if self.gate_up_proj is not None:      # merged already: merging is idempotent
            return
        self.gate_up_proj = MergedLinear([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x)       # views of one product: silu_mul reads them in place
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if self.fused:
            from blockspec.layers import triton_ops
            return self.down_proj(triton_ops.silu_mul(gate, up))
        return self.down_proj(nn.functional.silu(gate) * up)
