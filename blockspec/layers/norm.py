"""RMSNorm as Llama/Qwen checkpoints define it."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The eager RMSNorm: normalise in float32 like the reference, cast back before the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    # True: one Triton launch (blockspec.layers.triton_ops), bit for bit the eager code; set by
    # blockspec.layers.fused.enable_fused_ops.
    fused: bool = False
    # True: the fixed-order kernel of blockspec.layers.triton_invariant_norm (a row's result
    # independent of the batch; --batch-invariant); set by blockspec.layers.batch_invariant.
    batch_invariant: bool = False

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            from blockspec.layers import triton_invariant_norm
            return triton_invariant_norm.rms_norm(x, self.weight, self.eps)
        if self.fused:
            from blockspec.layers import triton_ops
            return triton_ops.rms_norm(x, self.weight, self.eps)
        return rms_norm_reference(x, self.weight, self.eps)

    def forward_with_residual(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(self(x + residual), x + residual)`: a decoder layer's residual add and this norm,
        one launch when fused."""
        if self.batch_invariant:
            from blockspec.layers import triton_invariant_norm
            return triton_invariant_norm.rms_norm(x, self.weight, self.eps, residual)
        if self.fused:
            from blockspec.layers import triton_ops
            return triton_ops.add_rms_norm(x, residual, self.weight, self.eps)
        summed = x + residual
        return self(summed), summed
