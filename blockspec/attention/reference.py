"""Reference paged attention: write new K/V, gather the row's pages, masked SDPA.

The CPU backend, and the oracle every kernel is tested against. It gathers all pages of every
row into a dense tensor and materialises the `[B, 1, Q, K]` mask: simple and slow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blockspec.attention.backend import AttentionBackend, AttentionPlan
from blockspec.attention.metadata import AttentionBatch
from blockspec.kv.cache import KVCache, LatentCache


class ReferenceBackend(AttentionBackend):
    name = "reference"

    def plan(self, batch: AttentionBatch, cache: KVCache, sliding_window: int | None = None,
             causal: bool = False, positions: torch.Tensor | None = None) -> AttentionPlan:
        if batch.page_table.device.type == "cpu":     # (on a GPU the length read would sync)
            batch = batch.without_spare_pages(cache.page_size)
        visible = batch.visibility(cache.page_size, sliding_window, positions, causal)
        return AttentionPlan(batch, sliding_window, positions, extra=visible)

    def forward(self, q, k, v, cache: KVCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        return paged_attention(q, k, v, cache, layer, plan.batch.slots, plan.batch.page_table, plan.extra, scale)

    def mla_forward(self, q, latent, cache: LatentCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        cache.write(layer, plan.batch.slots, latent)
        rows = cache.gather(layer, plan.batch.page_table)[:, :, None]      # [B, K, 1, R + P]: one shared head
        return masked_attention(q, rows, rows[..., :cache.latent_dim], plan.extra, scale)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                    slots: torch.Tensor, page_table: torch.Tensor, visible: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """q `[B, Q, Hq, D]`, new k/v `[B, Q, Hkv, D]`, visible `[B, 1, Q, K]` → out `[B, Q, Hq, D]`."""
    cache.write(layer, slots, k, v)
    keys, values = cache.gather(layer, page_table)                 # [B, K, Hkv, D]
    return masked_attention(q, keys, values, visible, scale)


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense attention with a boolean mask and grouped K/V heads."""
    groups = q.shape[2] // keys.shape[2]
    qh = q.transpose(1, 2)
    kh = keys.transpose(1, 2).to(q.dtype)
    vh = values.transpose(1, 2).to(q.dtype)
    if groups > 1:
        kh = kh.repeat_interleave(groups, dim=1)
        vh = vh.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    return out.transpose(1, 2)
