"""The Llama family of decoders: Llama, Qwen2 (q/k/v bias), Qwen3 (q/k norms) and Qwen3-MoE
(Qwen3 attention, routed experts in its `moe_layers`).

Parameter names follow the Hugging Face checkpoints, so a state dict loads as is.
One forward serves prefill, decode and tree verification: what differs is the
`AttentionBatch` (which keys each new token sees) and the positions. The shared forward
(embed, layers, capture, logits) is `models/base.py`.
"""

from __future__ import annotations

from torch import nn

from blockspec.attention.backend import AttentionBackend, AttentionPlan
from blockspec.config import ModelConfig
from blockspec.kv.cache import CacheSpec, KVCache
from blockspec.layers import RMSNorm, SwiGLU
from blockspec.layers.moe import MoE
from blockspec.layers.rope import ApplyRope
from blockspec.layers.linear import MergedLinear
from blockspec.models.base import DecoderLayer, DecoderLM


class LlamaAttention(nn.Module):
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
        self.qkv_proj: MergedLinear | None = None
        self.rope = ApplyRope()           # parameterless: q and k in one launch when fused

    def merge_projections(self) -> None:
        """q, k and v as one product (see layers/linear.py); the separate layers are dropped."""
        if self.qkv_proj is not None:          # merged already: merging is idempotent
            return
        self.qkv_proj = MergedLinear([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, layer: int, cache: KVCache, plan: AttentionPlan, backend: AttentionBackend):
        B, Q, _ = x.shape
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, Q, self.num_heads, self.head_dim)
        k = k.view(B, Q, self.num_kv_heads, self.head_dim)
        v = v.view(B, Q, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, k, cos, sin)
        out = backend.forward(q, k, v, cache, layer, plan, self.scale)
        return self.o_proj(out.reshape(B, Q, -1))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(LlamaAttention(cfg), self._mlp(cfg, i), cfg.hidden_size, cfg.rms_norm_eps)
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @staticmethod
    def _mlp(cfg: ModelConfig, layer: int) -> nn.Module:
        if layer in cfg.moe_layers:
            return MoE(cfg.hidden_size, cfg.moe)
        return SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)


class LlamaForCausalLM(DecoderLM):
    """Llama / Qwen2 / Qwen3 / Qwen3-MoE for causal LM, over a paged K/V cache."""

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend | None = None):
        super().__init__(cfg, backend, LlamaModel(cfg), cfg.head_dim)

    @property
    def cache_spec(self) -> CacheSpec:
        return CacheSpec(self.config.num_layers, self.config.num_kv_heads, self.config.head_dim)
