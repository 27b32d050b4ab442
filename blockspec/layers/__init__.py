"""Layers shared by every model family and the DFlash drafter (one definition each)."""

from blockspec.layers.mlp import SwiGLU
from blockspec.layers.norm import RMSNorm
from blockspec.layers.rope import RotaryEmbedding, apply_rope, rope_inv_freq

__all__ = ["RMSNorm", "RotaryEmbedding", "SwiGLU", "apply_rope", "rope_inv_freq"]
