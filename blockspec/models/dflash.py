"""DFlash block-diffusion drafter in z-lab's checkpoint format (docs/dflash.md).

A few Qwen3-style layers with no embedding or LM head of their own (the target's are used).
The target's hidden states after `target_layer_ids` are fused (`fc`, `hidden_norm`) into one
context feature per token; every layer projects that feature with its own k/v projections
into K/V placed before the block's own K/V. Block queries see all context and the whole
block (no causal mask), except in sliding-window layers.

Context K/V lives in the drafter's own paged cache, which shares the target's page tables:
the context entry of position p sits in the same slot as the target's K/V of position p.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from blockspec.attention.backend import AttentionBackend
from blockspec.attention.metadata import AttentionBatch
from blockspec.config import ModelConfig, RopeConfig
from blockspec.kv.cache import CacheSpec, KVCache
from blockspec.layers import RMSNorm, RotaryEmbedding, SwiGLU
from blockspec.layers.linear import MergedLinear
from blockspec.layers.rope import ApplyRope
from blockspec.models.base import default_backend
from blockspec.models.loader import load_state_dict


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """One draft layer → the middle target layer; else evenly spaced from 1 to n − 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    # Very shallow targets (tests) would give end < start: keep the ids inside the model.
    start = min(1, num_target_layers - 1)
    end = max(start, num_target_layers - 3)
    return [round(start + (end - start) * i / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    layer_types: tuple[str, ...]
    sliding_window: int | None
    is_causal: bool | None

    @classmethod
    def from_hf(cls, cfg: dict, num_target_layers: int | None = None) -> "DFlashConfig":
        dcfg = cfg.get("dflash_config") or {}
        n_layers = int(cfg["num_hidden_layers"])
        n_target = cfg.get("num_target_layers", num_target_layers)
        layer_ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
        if layer_ids is None:
            if n_target is None:
                raise ValueError("drafter config has neither target_layer_ids nor num_target_layers")
            layer_ids = default_target_layer_ids(int(n_target), n_layers)
        mask_id = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
        if mask_id is None:
            raise ValueError("drafter config lacks dflash_config.mask_token_id")
        heads = int(cfg["num_attention_heads"])
        layer_types = tuple(cfg.get("layer_types") or ["full_attention"] * n_layers)
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=n_layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            vocab_size=int(cfg["vocab_size"]),
            block_size=int(dcfg.get("block_size", cfg.get("block_size", 16))),
            mask_token_id=int(mask_id),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            num_target_layers=None if n_target is None else int(n_target),
            layer_types=layer_types,
            sliding_window=cfg.get("sliding_window"),
            is_causal=cfg.get("is_causal"),
        )

    def check_fits(self, target: ModelConfig) -> None:
        """Refuse a drafter whose sizes do not fit the target, naming what differs."""
        if self.hidden_size != target.hidden_size:
            raise ValueError(f"drafter hidden_size {self.hidden_size} != target hidden_size {target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise ValueError(f"drafter vocab_size {self.vocab_size} != target vocab_size {target.vocab_size}")
        if self.num_target_layers is not None and self.num_target_layers != target.num_layers:
            raise ValueError(f"drafter was trained for {self.num_target_layers} target layers, "
                             f"target has {target.num_layers}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            raise ValueError(f"drafter target_layer_ids {bad} are outside the target's {target.num_layers} layers")
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise ValueError(f"drafter mask_token_id {self.mask_token_id} is outside the target vocabulary")

    @property
    def cache_spec(self) -> CacheSpec:
        """The drafter's context K/V per token and layer."""
        return CacheSpec(self.num_layers, self.num_kv_heads, self.head_dim)

    def layer_window(self, layer: int) -> tuple[int | None, bool]:
        """(sliding window or None, causal) of one layer, as z-lab's reference treats them."""
        sliding = self.layer_types[layer] == "sliding_attention"
        causal = sliding if self.is_causal is None else bool(self.is_causal)
        return (self.sliding_window if sliding else None), causal


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim ** -0.5
        self.rope = ApplyRope()
        # CUDA fast path (merge_projections): the block's q/k/v and the context's k/v as one
        # product each; the trainer and the CPU keep the checkpoint's separate layers.
        self.qkv_proj: MergedLinear | None = None
        self.kv_proj: MergedLinear | None = None

    def merge_projections(self) -> None:
        if self.qkv_proj is not None:          # merged already: merging is idempotent
            return
        self.qkv_proj = MergedLinear([self.q_proj, self.k_proj, self.v_proj])
        self.kv_proj = MergedLinear([self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def _heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        return t.view(*t.shape[:2], heads, self.head_dim)

    def project_qkv(self, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block's normed, rotated q and k and its v, `[B, S, heads, D]`."""
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(h)
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q = self.q_norm(self._heads(q, self.num_heads))
        k = self.k_norm(self._heads(k, self.num_kv_heads))
        q, k = self.rope(q, k, cos, sin)
        return q, k, self._heads(v, self.num_kv_heads)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Context K/V of target features `x [B, T, H]`: normed, rotated k and v."""
        if self.kv_proj is not None:
            k, v = self.kv_proj(x)
        else:
            k, v = self.k_proj(x), self.v_proj(x)
        k, _ = self.rope(self.k_norm(self._heads(k, self.num_kv_heads)), None, cos, sin)
        return k, self._heads(v, self.num_kv_heads)


class DFlashLayer(nn.Module):
    """One drafter layer, the same for the engine (paged context K/V through the attention
    backend) and the trainer (dense context K/V): only `attend` differs."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """x `[B, S, H]`; `attend(q [B,S,Hq,D], k, v [B,S,Hkv,D]) → [B,S,Hq,D]` adds the context."""
        attn = self.self_attn
        q, k, v = attn.project_qkv(self.input_layernorm(x), cos, sin)
        out = attn.o_proj(attend(q, k, v).reshape(*x.shape[:2], -1))
        h, x = self.post_attention_layernorm.forward_with_residual(out, x)   # x + attention, normed
        return x + self.mlp(h)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig, backend: AttentionBackend | None = None):
        super().__init__()
        self.config = cfg
        self.backend = backend or default_backend()
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features `[B, T, K·H]` → one context vector per token `[B, T, H]`."""
        return self.hidden_norm(self.fc(features))

    def write_context(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      cache: KVCache) -> None:
        """Project committed tokens' target features into every layer's context K/V."""
        ctx = self.fuse(features.to(self.fc.weight.dtype))
        cos, sin = self.rotary(positions, ctx.dtype)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(ctx, cos, sin)
            cache.write(i, slots, k, v)

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                batch: AttentionBatch) -> torch.Tensor:
        """Block `[B, S, H]` at `positions` attending to cached context + itself → normed hidden."""
        x = block_embeds
        cos, sin = self.rotary(positions, x.dtype)
        plans = {}
        for i, layer in enumerate(self.layers):
            window, causal = self.config.layer_window(i)
            if (window, causal) not in plans:
                plans[(window, causal)] = self.backend.plan(batch, cache, window, causal, positions)
            plan, scale = plans[(window, causal)], layer.self_attn.scale
            x = layer(x, cos, sin, lambda q, k, v: self.backend.forward(q, k, v, cache, i, plan, scale))
        return self.norm(x)


def read_drafter_config(draft_dir: str | Path, target: ModelConfig) -> DFlashConfig:
    """A z-lab–format drafter's config, checked against the target (no weights read)."""
    path = Path(draft_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in drafter directory {draft_dir}")
    raw = json.loads(path.read_text())
    archs = raw.get("architectures") or []
    if archs and not any("DFlash" in a for a in archs):
        raise ValueError(f"{draft_dir} is not a DFlash drafter (architectures: {archs})")
    cfg = DFlashConfig.from_hf(raw, target.num_layers)
    cfg.check_fits(target)
    return cfg


def load_drafter(draft_dir: str | Path, target: ModelConfig, dtype: torch.dtype,
                 device: torch.device, backend: AttentionBackend | None = None) -> DFlashDrafter:
    """Load a z-lab–format DFlash drafter and check that it fits the target."""
    cfg = read_drafter_config(draft_dir, target)
    state = {k.removeprefix("model."): v for k, v in load_state_dict(draft_dir).items()}
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    expected = set(model.state_dict())
    missing = expected - set(state)
    if missing:
        raise ValueError(f"drafter {draft_dir} lacks weights: {sorted(missing)[:5]}")
    extra = sorted(k for k in set(state) - expected if not k.endswith("inv_freq"))
    if extra:
        raise ValueError(f"drafter {draft_dir} has unexpected weights: {extra[:5]}")
    model.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    model.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
    model = model.to(device=device, dtype=dtype)
    model.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim).to(device)
    if backend is not None:
        model.backend = backend
    return model.eval()
