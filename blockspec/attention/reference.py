"""Reference paged attention: write new K/V, gather the row's pages, masked SDPA.

Works on CPU and GPU; the Triton kernel (later) must agree with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blockspec.kv.cache import KVCache


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
