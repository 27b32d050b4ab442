"""Rotary position embeddings: frequencies (default and Llama 3 scaling), cos/sin, rotation."""

from __future__ import annotations

import math

import torch
from torch import nn

from blockspec.config import RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies, with Llama 3's wavelength-dependent scaling when configured."""
    # float32 throughout, as transformers computes it, so greedy outputs agree bit for bit.
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
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


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary (per-token) positions, so tree nodes can sit at prefix + depth."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, T, H, D]`, cos/sin `[B, T, D]` (rotate-half convention of HF checkpoints)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


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
