"""A linear layer whose weight stays packed INT4 in memory (W4A16).

Buffers are named as compressed-tensors checkpoints name them (`weight_packed`, `weight_scale`),
so the loader hands a packed checkpoint tensor to this layer as it is stored. On CUDA the
product runs in the W4A16 Triton kernel (`triton_w4a16.grouped_matmul`, one expert); elsewhere
the reference: dequantise to the activation dtype, then `F.linear` — what a model loaded with
dequantised weights computes.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from blockspec.layers.packed_int import dequantize_packed, load_n_major, n_major, pack_int32, quantize_symmetric


class Int4Linear(nn.Module):
    """y `[..., N]` = x `[..., K]` · dequant(weight_packed `[N, ceil(K·b/32)]`, weight_scale `[N, ceil(K/G)]`)ᵀ (+ bias)."""

    # None: the kernel on CUDA, the reference elsewhere; True forces the kernel (tests run it
    # under Triton's interpreter on CPU), False the reference.
    kernel: bool | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group_size: int = 32,
                 num_bits: int = 4, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.num_bits = group_size, num_bits
        words = math.ceil(in_features * num_bits / 32)
        # N-major (`packed_int.n_major`): the layout the W4A16 kernel reads at the memory's rate.
        self.register_buffer("weight_packed", n_major(torch.zeros(out_features, words, dtype=torch.int32,
                                                                  device=device)))
        self.register_buffer("weight_scale", n_major(torch.ones(out_features, math.ceil(in_features / group_size),
                                                                dtype=dtype, device=device)))
        load_n_major(self, "weight_packed", "weight_scale")
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, num_bits: int = 4) -> "Int4Linear":
        """`linear` quantised round-to-nearest, symmetric, in groups of `group_size` along K."""
        w = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size, num_bits,
                    device=w.device, dtype=w.dtype)
        values, scale = quantize_symmetric(w, group_size, num_bits)
        layer.weight_packed.copy_(pack_int32(values, num_bits))
        layer.weight_scale.copy_(scale)
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach())
        return layer

    def dequantized(self) -> torch.Tensor:
        """The weight `[N, K]` in float32."""
        return dequantize_packed(self.weight_packed, self.weight_scale, self.in_features, self.group_size,
                                 self.num_bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        use_kernel = x.is_cuda if self.kernel is None else self.kernel
        if not use_kernel:
            return F.linear(x, self.dequantized().to(x.dtype), self.bias)
        from blockspec.layers.triton_w4a16 import grouped_matmul
        rows = x.reshape(-1, self.in_features)
        # [0, T] made on the device (a host list would be a copy, which CUDA graphs cannot capture).
        offsets = torch.arange(2, dtype=torch.int32, device=x.device) * rows.shape[0]
        y = grouped_matmul(rows, self.weight_packed[None], self.weight_scale[None], offsets,
                           self.group_size, self.num_bits)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.num_bits}, "
                f"group={self.group_size}, bias={self.bias is not None}")
