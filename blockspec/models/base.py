"""What every target family shares: embed → decoder layers → final norm, feature capture, logits.

A family supplies its decoder layers; each layer is called as
`layer(x, residual, cos, sin, index, cache, plan, backend) -> (x, residual, stream)` (its output
is x + residual, added by the next norm; `stream` is its input, the previous layer's output)
and reaches attention only through `backend` (the engine's choice: reference on CPU, Triton on
CUDA), never a kernel directly.
"""

from __future__ import annotations

import torch
from torch import nn

from blockspec.attention.backend import AttentionBackend
from blockspec.attention.metadata import AttentionBatch
from blockspec.attention.reference import ReferenceBackend
from blockspec.kv.cache import CacheSpec, KVCache
from blockspec.layers.linear import merge_submodule_projections
from blockspec.layers.moe import stack_expert_weights
from blockspec.layers.norm import RMSNorm
from blockspec.layers.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    """Pre-norm residual block of every family: norm → `self_attn` → add & norm → `mlp`.

    `self_attn(h, cos, sin, layer, cache, plan, backend)` is the family's attention; `mlp` a
    SwiGLU or a mixture of experts, `[B, Q, H] → [B, Q, H]`."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(self, x, residual, cos, sin, layer, cache, plan, backend):
        """x: the previous layer's MLP output (the embeddings for the first layer, residual
        None); returns `(mlp output, residual stream, input stream)`. The layer's output is the
        first two's sum, which the next norm adds (`forward_with_residual`: one launch when fused,
        bit for bit `residual + mlp` either way); so the next layer's input stream is that output,
        which feature capture takes from there instead of adding it again."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.forward_with_residual(x, residual)
        stream = residual
        attn = self.self_attn(h, cos, sin, layer, cache, plan, backend)
        h, residual = self.post_attention_layernorm.forward_with_residual(attn, residual)
        return self.mlp(h), residual, stream


class DecoderLM(nn.Module):
    """Subclasses build theirs with `__init__(config, backend, model, rotary_dim)`: `model` has
    `embed_tokens`, `layers`, `norm`; `backend` defaults to the reference."""

    backend: AttentionBackend

    def __init__(self, cfg, backend: AttentionBackend | None, model: nn.Module, rotary_dim: int):
        super().__init__()
        self.config = cfg
        self.backend = backend or default_backend()
        self.model = model
        self.rotary = RotaryEmbedding(cfg.rope, rotary_dim)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_backend(self, backend: AttentionBackend) -> None:
        self.backend = backend

    @property
    def cache_spec(self) -> CacheSpec:
        raise NotImplementedError

    # Weights kept in float32 whatever the serving dtype (name suffixes; the MoE router's).
    float32_weights: tuple[str, ...] = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")

    def convert_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors under this model's names: per-expert matrices stacked
        (layers/moe.py); the identity for dense families."""
        return stack_expert_weights(state)

    def merge_projections(self) -> None:
        """Merge every layer's projections that read the same input (CUDA fast path)."""
        merge_submodule_projections(self)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                batch: AttentionBatch, capture_layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the decoder over new tokens `[B, Q]`, writing their K/V into the cache.

        Returns the final-normed hidden states `[B, Q, H]` and, when `capture_layers` is given,
        the outputs of those decoder layers concatenated on the feature axis `[B, Q, K·H]`
        (layer id i = output of decoder layer i = transformers' hidden_states[i + 1]; for the
        last layer that tuple holds the final-normed state, and so do we).
        """
        x, residual = self.embed(input_ids), None
        cos, sin = self.rotary(positions, x.dtype)
        plan = self.backend.plan(batch, cache)
        captured = {}
        for i, layer in enumerate(self.model.layers):
            # A layer's output is x + residual; the next norm adds it (one launch), and the next
            # layer hands it back as its input stream: captured with no add of its own.
            x, residual, stream = layer(x, residual, cos, sin, i, cache, plan, self.backend)
            if i - 1 in capture_layers:
                captured[i - 1] = stream
        normed = self.model.norm(x) if residual is None else self.model.norm.forward_with_residual(x, residual)[0]
        captured[len(self.model.layers) - 1] = normed
        features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        return normed, features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def default_backend() -> AttentionBackend:
    return ReferenceBackend()
