"""DeepSeek-V3 / Kimi K2: multi-head latent attention (MLA) and routed experts (docs/models.md).

Parameter names follow the Hugging Face checkpoints (per-expert matrices are stacked at load,
`DecoderLM.convert_checkpoint`). The paged cache holds, per token and layer, the normalised KV
latent and the rotated shared rotary key (`LatentCacheSpec`: kv_lora_rank + qk_rope_head_dim
values), never the per-head keys and values. Attention runs in the absorbed form for every
step (prefill, decode, verify): each head's no-rope query is mapped into the latent space by
its slice of `kv_b_proj` (W_UK), attends over the cached rows through the backend's
`mla_forward`, and the latent output is mapped out by the other slice (W_UV). That is the
expanded form's attention reassociated, so it equals transformers' to rounding.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from blockspec.attention.backend import AttentionBackend, AttentionPlan
from blockspec.config_deepseek import DeepseekV3Config
from blockspec.kv.cache import LatentCache, LatentCacheSpec
from blockspec.layers import RMSNorm, SwiGLU
from blockspec.layers.linear import MergedLinear
from blockspec.layers.moe import MoE
from blockspec.layers.rope import apply_rope, apply_rope_interleaved, softmax_scale
from blockspec.models.base import DecoderLayer, DecoderLM

log = logging.getLogger("blockspec.models")


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope `[B, Q, H, N]`, W_UK `[H, N, R]` → the query in latent space `[B, Q, H, R]`
    (q_nope · k_nope = q_nope · W_UK c = (q_nope W_UK) · c)."""
    B, Q, H, N = q_nope.shape
    return torch.bmm(q_nope.reshape(B * Q, H, N).transpose(0, 1), w_uk).transpose(0, 1).reshape(B, Q, H, -1)


def expand_output(out_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """Softmax-weighted latent `[B, Q, H, R]`, W_UV `[H, V, R]` → per-head values `[B, Q, H, V]`."""
    B, Q, H, R = out_latent.shape
    flat = out_latent.reshape(B * Q, H, R).transpose(0, 1)                 # [H, BQ, R]
    return torch.bmm(flat, w_uv.transpose(1, 2)).transpose(0, 1).reshape(B, Q, H, -1)


class MLAttention(nn.Module):
    def __init__(self, cfg: DeepseekV3Config):
        super().__init__()
        self.num_heads, self.nope, self.rope_dim = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.latent_dim, self.v_dim = cfg.kv_lora_rank, cfg.v_head_dim
        q_out = cfg.num_heads * cfg.qk_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                            bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.v_head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.scale = softmax_scale(cfg.rope, cfg.qk_head_dim)
        self.rotate = apply_rope_interleaved if cfg.rope_interleave else apply_rope
        self.q_lora = cfg.q_lora_rank is not None
        self.q_kv_a_proj: MergedLinear | None = None

    def merge_projections(self) -> None:
        """The query's first projection and the KV latent's as one product (layers/linear.py)."""
        if self.q_kv_a_proj is not None:
            return
        if self.q_lora:
            self.q_kv_a_proj = MergedLinear([self.q_a_proj, self.kv_a_proj_with_mqa])
            del self.q_a_proj
        else:
            self.q_kv_a_proj = MergedLinear([self.q_proj, self.kv_a_proj_with_mqa])
            del self.q_proj
        del self.kv_a_proj_with_mqa

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x `[B, Q, hidden]` → (q `[B, Q, H·(N + P)]`, latent and rotary key `[B, Q, R + P]`)."""
        if self.q_kv_a_proj is not None:
            q, kv = self.q_kv_a_proj(x)
            return (self.q_b_proj(self.q_a_layernorm(q)) if self.q_lora else q), kv
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        return q, self.kv_a_proj_with_mqa(x)

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK `[H, N, R]` and W_UV `[H, V, R]`: views of `kv_b_proj.weight` (no copy)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.latent_dim)
        return w[:, :self.nope], w[:, self.nope:]

    def forward(self, x, cos, sin, layer: int, cache: LatentCache, plan: AttentionPlan, backend: AttentionBackend):
        B, Q, _ = x.shape
        q, kv = self.project(x)
        q_nope, q_rope = q.view(B, Q, self.num_heads, -1).split([self.nope, self.rope_dim], dim=-1)
        latent, k_rope = kv.split([self.latent_dim, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_rope = self.rotate(q_rope, cos, sin)
        k_rope = self.rotate(k_rope[:, :, None], cos, sin)[:, :, 0]
        w_uk, w_uv = self.absorbed_weights()
        query = torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1)       # [B, Q, H, R + P]
        out = backend.mla_forward(query, torch.cat([latent, k_rope], dim=-1), cache, layer, plan, self.scale)
        return self.o_proj(expand_output(out, w_uv).reshape(B, Q, -1))


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: DeepseekV3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(MLAttention(cfg), MoE(cfg.hidden_size, cfg.moe) if i in cfg.moe_layers
                         else SwiGLU(cfg.hidden_size, cfg.intermediate_size), cfg.hidden_size, cfg.rms_norm_eps)
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DeepseekV3ForCausalLM(DecoderLM):
    """DeepSeek-V3 / Kimi K2 for causal LM, over a paged latent cache."""

    def __init__(self, cfg: DeepseekV3Config, backend: AttentionBackend | None = None):
        super().__init__(cfg, backend, DeepseekV3Model(cfg), cfg.qk_rope_head_dim)

    @property
    def cache_spec(self) -> LatentCacheSpec:
        return LatentCacheSpec(self.config.num_layers, self.config.kv_lora_rank, self.config.qk_rope_head_dim)

    def convert_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Also drops the multi-token-prediction layers DeepSeek-V3 ships after the last layer
        (`model.layers.{num_layers}…`), which this model does not run."""
        n = self.config.num_layers
        extra = [k for k in state if k.startswith("model.layers.") and int(k.split(".")[2]) >= n]
        for k in extra:
            del state[k]
        if extra:
            log.info(
                "skipped %d weights of layers ≥ %d (multi-token prediction, not used)", len(extra), n)
        return super().convert_checkpoint(state)
