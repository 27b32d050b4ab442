"""Symmetric b-bit integer weights packed into int32 words (compressed-tensors "pack-quantized").

Value k of a row sits in word k // (32/b) at bit b·(k mod 32/b), least significant first, with
an offset of 2^(b-1) (8 for int4) so that every field is unsigned. Scales are one per group of
G consecutive values along K (the input dimension); the weight is `value · scale`.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def pack_int32(values: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Signed integers `[..., K]` (in [-2^(b-1), 2^(b-1))) packed along K → int32 `[..., ceil(K·b/32)]`."""
    per_word = 32 // num_bits
    k = values.shape[-1]
    unsigned = (values.to(torch.int64) + (1 << (num_bits - 1))).clamp_(0, (1 << num_bits) - 1)
    unsigned = torch.nn.functional.pad(unsigned, (0, -k % per_word))
    shifts = torch.arange(per_word, dtype=torch.int64, device=values.device) * num_bits
    words = (unsigned.view(*values.shape[:-1], -1, per_word) << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)   # two's complement


def unpack_int32(packed: torch.Tensor, num_bits: int, k: int) -> torch.Tensor:
    """int32 `[..., W]` → the signed integers `[..., K]` (int8) that `pack_int32` packed."""
    per_word = 32 // num_bits
    shifts = torch.arange(per_word, dtype=torch.int32, device=packed.device) * num_bits
    # `>>` sign-extends a negative word; the mask keeps only the field's bits.
    fields = (packed.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    return (fields.flatten(-2)[..., :k] - (1 << (num_bits - 1))).to(torch.int8)


def n_major(t: torch.Tensor) -> torch.Tensor:
    """The same `[..., N, W]` values stored with N contiguous (a view of a `[..., W, N]` copy;
    unchanged when already so): the W4A16 kernel's tiles then read neighbouring output columns
    from neighbouring words. `Module.to` keeps these strides."""
    if t.dim() < 2 or t.stride(-2) == 1:
        return t
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def stack_n_major(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`torch.stack` of `[N, W]` tensors → `[E, N, W]` stored N-major (`n_major`), in one copy."""
    return torch.stack([t.T for t in tensors]).transpose(1, 2)


def load_n_major(module: nn.Module, *names: str) -> None:
    """Have `module.load_state_dict` store its packed buffers `names` N-major (`n_major`)
    whatever layout the state dict brings (checkpoints are K-major)."""
    def to_n_major(mod, state_dict, prefix, *_):
        for name in names:
            if prefix + name in state_dict:
                state_dict[prefix + name] = n_major(state_dict[prefix + name])
    module.register_load_state_dict_pre_hook(to_n_major)


def dequantize_packed(packed: torch.Tensor, scale: torch.Tensor, k: int, group_size: int,
                      num_bits: int = 4) -> torch.Tensor:
    """Packed integers `[..., N, W]` with scales `[..., N, ceil(K/G)]` for groups of G along K
    (the last group may be short) → float32 `[..., N, K]`."""
    if scale.shape[-1] != math.ceil(k / group_size):
        raise ValueError(f"weight_scale has {scale.shape[-1]} groups; {k} columns in groups of "
                         f"{group_size} need {math.ceil(k / group_size)}")
    values = unpack_int32(packed, num_bits, k).float()
    return values * scale.float().repeat_interleave(group_size, -1)[..., :k]


def quantize_symmetric(weight: torch.Tensor, group_size: int, num_bits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest symmetric quantisation of `[..., N, K]` in groups of G along K →
    (int8 values `[..., N, K]`, float32 scales `[..., N, ceil(K/G)]`); the scale maps the group's
    largest magnitude to half the integer range (compressed-tensors' min-max observer)."""
    k = weight.shape[-1]
    w = torch.nn.functional.pad(weight.float(), (0, -k % group_size))
    groups = w.view(*w.shape[:-1], -1, group_size)
    qmin, qmax = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    scale = groups.abs().amax(-1) / ((qmax - qmin) / 2)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale.unsqueeze(-1)).clamp_(qmin, qmax)
    return q.flatten(-2)[..., :k].to(torch.int8), scale
