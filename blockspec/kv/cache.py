"""K/V tensors of the paged cache: write, gather and compaction, all fixed-shape tensor ops.

The layout is described by a `CacheSpec` that each model provides (`model.cache_spec`): the
engine allocates from it without knowing the family. Today every family stores per-head K and
V (MHA/GQA); a latent layout (MLA) is another spec.
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
