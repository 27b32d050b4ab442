"""K/V tensors of the paged cache: write, gather and compaction, all fixed-shape tensor ops.

The layout is described by a spec that each model provides (`model.cache_spec`): the engine
allocates from it without knowing the family. MHA/GQA families store per-head K and V
(`CacheSpec` → `KVCache`); MLA stores one compressed latent per token and layer
(`LatentCacheSpec` → `LatentCache`). Both have the same pages, `page_size`, `move` (compaction)
and `bytes_per_token`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheSpec:
    """Per token and layer: `num_kv_heads × head_dim` keys and as many values."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def allocate(self, num_pages: int, page_size: int, dtype: torch.dtype,
                 device: torch.device | str) -> "KVCache":
        return KVCache(self.num_layers, num_pages, page_size, self.num_kv_heads, self.head_dim, dtype, device)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(dtype).bits // 8


class KVCache:
    """K and V for `num_layers` layers: `[num_layers, num_pages * page_size, kv_heads, head_dim]`."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size
        self.num_pages = num_pages

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V `[B, Q, H, D]` at `slots [B, Q]` (padding rows point into page 0)."""
        flat = slots.reshape(-1)
        self.k[layer].index_copy_(0, flat, k.reshape(-1, *k.shape[2:]).to(self.k.dtype))
        self.v[layer].index_copy_(0, flat, v.reshape(-1, *v.shape[2:]).to(self.v.dtype))

    def gather(self, layer: int, page_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of whole pages in sequence order: `[B, P * page_size, H, D]`."""
        slots = gather_slots(page_table, self.page_size)
        return self.k[layer][slots], self.v[layer][slots]

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy entries src → dst in every layer (compaction). Unused pairs should be 0 → 0."""
        src, dst = src_slots.reshape(-1), dst_slots.reshape(-1)
        self.k.index_copy_(1, dst, self.k.index_select(1, src))
        self.v.index_copy_(1, dst, self.v.index_select(1, src))


@dataclass(frozen=True)
class LatentCacheSpec:
    """Per token and layer: MLA's normalised KV latent (`latent_dim`) and its rotated shared
    rotary key (`rope_dim`), one row of `latent_dim + rope_dim` values for all heads."""

    num_layers: int
    latent_dim: int
    rope_dim: int

    @property
    def row_dim(self) -> int:
        return self.latent_dim + self.rope_dim

    def allocate(self, num_pages: int, page_size: int, dtype: torch.dtype,
                 device: torch.device | str) -> "LatentCache":
        return LatentCache(self.num_layers, num_pages, page_size, self.latent_dim, self.rope_dim, dtype, device)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.num_layers * self.row_dim * torch.finfo(dtype).bits // 8


class LatentCache:
    """`latent [num_layers, num_pages * page_size, latent_dim + rope_dim]`: row [:latent_dim] is
    the latent (values, and keys through the absorbed projection), row [latent_dim:] the rotary key."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, latent_dim: int, rope_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.latent = torch.zeros(num_layers, num_pages * page_size, latent_dim + rope_dim, dtype=dtype, device=device)
        self.latent_dim, self.rope_dim = latent_dim, rope_dim
        self.page_size = page_size
        self.num_pages = num_pages

    def write(self, layer: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        """Store new rows `[B, Q, latent_dim + rope_dim]` at `slots [B, Q]`."""
        self.latent[layer].index_copy_(0, slots.reshape(-1), latent.reshape(-1, latent.shape[-1]).to(self.latent.dtype))

    def gather(self, layer: int, page_table: torch.Tensor) -> torch.Tensor:
        """Rows of whole pages in sequence order: `[B, P * page_size, latent_dim + rope_dim]`."""
        return self.latent[layer][gather_slots(page_table, self.page_size)]

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy entries src → dst in every layer (compaction). Unused pairs should be 0 → 0."""
        src, dst = src_slots.reshape(-1), dst_slots.reshape(-1)
        self.latent.index_copy_(1, dst, self.latent.index_select(1, src))


def gather_slots(page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """Slot index of every position covered by `page_table [B, P]`: `[B, P * page_size]`."""
    offsets = torch.arange(page_size, device=page_table.device)
    return (page_table[:, :, None] * page_size + offsets).reshape(page_table.shape[0], -1)


def compaction_slots(page_table: torch.Tensor, page_size: int, start: torch.Tensor,
                     keep_offsets: torch.Tensor, keep_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and destination slots that move kept entries to be contiguous.

    For row b the entries at positions start[b] + keep_offsets[b, i] (increasing in i) move to
    start[b] + i, where keep_mask[b, i]; masked-off pairs become 0 → 0 (a no-op in page 0).
    """
    all_slots = gather_slots(page_table, page_size)
    limit = all_slots.shape[1] - 1
    src_pos = (start[:, None] + keep_offsets.clamp(min=0)).clamp(max=limit)
    dst_pos = (start[:, None] + torch.arange(keep_offsets.shape[1], device=start.device)).clamp(max=limit)
    src = torch.where(keep_mask, all_slots.gather(1, src_pos), 0)
    dst = torch.where(keep_mask, all_slots.gather(1, dst_pos), 0)
    return src, dst
