"""Linear layers that read the same input, merged into one matrix product.

A decode step is memory-bound: merging q/k/v (and gate/up) reads the same bytes in one launch
instead of three (two). Checkpoints keep their separate names; merging happens after loading,
on CUDA only, because on the CPU the separate products are what the bit-exact comparison
against transformers checks.
"""

from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Module):
    """`forward(x)` returns the outputs of the merged layers, in order (views of one product)."""

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        first = linears[0]
        has_bias = first.bias is not None
        self.sizes = [lin.out_features for lin in linears]
        self.linear = nn.Linear(first.in_features, sum(self.sizes), bias=has_bias,
                                device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if has_bias:
                self.linear.bias.copy_(torch.cat([lin.bias for lin in linears]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(x).split(self.sizes, dim=-1)


def merge_submodule_projections(module: nn.Module) -> None:
    """`merge_projections()` on every submodule of `module` that has one (a target's attention
    and MLP layers, a drafter's): the CUDA fast path's merged products, idempotent."""
    for sub in module.modules():
        if sub is not module and hasattr(sub, "merge_projections"):
            sub.merge_projections()
