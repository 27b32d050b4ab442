"""The Llama family of decoders: Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norms).

Parameter names follow the Hugging Face checkpoints, so a state dict loads as is.
One forward serves prefill, decode and tree verification: what differs is the
`AttentionBatch` (which keys each new token sees) and the positions.
"""

from __future__ import annotations

import torch
from torch import nn

from blockspec.attention.metadata import AttentionBatch
from blockspec.attention.reference import paged_attention
from blockspec.config import ModelConfig
from blockspec.kv.cache import KVCache
from blockspec.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, cos, sin, layer: int, cache: KVCache, batch: AttentionBatch, visible):
        B, Q, _ = x.shape
        q = self.q_proj(x).view(B, Q, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, Q, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, Q, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = paged_attention(q, k, v, cache, layer, batch.slots, batch.page_table, visible, self.scale)
        return self.o_proj(out.reshape(B, Q, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, layer, cache, batch, visible):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache, batch, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 for causal LM, over a paged K/V cache."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

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
        x = self.embed(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        visible = batch.visibility(cache.page_size)
        captured = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, i, cache, batch, visible)
            if i in capture_layers:
                captured[i] = x
        normed = self.model.norm(x)
        captured[len(self.model.layers) - 1] = normed
        features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        return normed, features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
