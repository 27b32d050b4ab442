"""Rotary position embeddings: frequencies (default, Llama 3 and YaRN scaling), cos/sin, rotation
(rotate-half, and DeepSeek's interleaved pairs)."""

from __future__ import annotations

import math

import torch
from torch import nn

from blockspec.config import RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies, with Llama 3's wavelength-dependent scaling when configured."""
    # float32 throughout, as transformers computes it, so greedy outputs agree bit for bit.
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    if rope.rope_type != "llama3":
        return inv_freq
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction `0.1 · mscale · ln(scale) + 1` (1 when not extending)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN's frequencies: interpolated (÷ factor) below the ramp, original above it, blended
    linearly between the dimensions that make `beta_slow` and `beta_fast` rotations over the
    original context (transformers' formula, float32)."""
    base, factor, original = rope.theta, rope.factor, rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                      # no zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_attention_factor(rope: RopeConfig) -> float:
    """The scale YaRN puts on cos/sin (1 for the other types)."""
    if rope.rope_type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    return yarn_mscale(rope.factor)


def softmax_scale(rope: RopeConfig, head_dim: int) -> float:
    """`head_dim ** -0.5`, times YaRN's mscale(factor, mscale_all_dim)² when configured: the
    correction MLA applies to every dimension of q·k, rotary or not (DeepSeek's reference)."""
    scale = head_dim ** -0.5
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary (per-token) positions, so tree nodes can sit at prefix + depth."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)
        self.attention_factor = rope_attention_factor(rope)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, T, H, D]`, cos/sin `[B, T, D]` (rotate-half convention of HF checkpoints)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek's layout: pairs (x0, x1), (x2, x3), … each rotated by one frequency; the result
    lists the pairs' first elements, then their second ones (transformers' `rope_interleave`).
    x `[B, T, H, D]`, cos/sin `[B, T, D]` as `RotaryEmbedding` gives them."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, :, None, :half], sin[:, :, None, :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class ApplyRope(nn.Module):
    """`apply_rope` as a (parameterless) submodule, so that a layer's rotation can be switched to
    the fused Triton kernel (`fused`, set by blockspec.layers.fused.enable_fused_ops) like its
    norms and MLP. `self.rope(q, k, cos, sin)` rotates q and k (k may be None), one launch when
    fused; bit for bit `apply_rope` either way."""

    fused: bool = False

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.fused:
            from blockspec.layers import triton_ops
            return triton_ops.apply_rope_qk(q, k, cos, sin)
        return apply_rope(q, cos, sin), (None if k is None else apply_rope(k, cos, sin))
