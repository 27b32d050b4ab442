"""The batch-invariant backend (`--batch-invariant`): new K/V written as the Triton backend
writes them, attention by `attention/triton_invariant.py`, whose result for a query depends on
its own keys alone (not on the verify width, the tree's layout or the batch).

A tree's ancestor table is built once per forward in `plan` (device-side, capturable). Refused,
with a ValueError naming batch_invariant: MLA (`mla_forward`) and sliding windows.
"""

from __future__ import annotations

import torch

from blockspec.attention.backend import AttentionBackend, AttentionPlan
from blockspec.attention.metadata import AttentionBatch
from blockspec.attention.triton_invariant import invariant_attention, tree_ancestors
from blockspec.attention.triton_kv_write import store_new_kv
from blockspec.kv.cache import KVCache, LatentCache


class BatchInvariantBackend(AttentionBackend):
    name = "triton-invariant"

    def plan(self, batch: AttentionBatch, cache: KVCache, sliding_window: int | None = None,
             causal: bool = False, positions: torch.Tensor | None = None) -> AttentionPlan:
        if sliding_window is not None:
            raise ValueError(f"batch_invariant attention has no sliding window (asked for {sliding_window})")
        kind, new_mask = batch.mask_for(causal)
        ancestors = tree_ancestors(new_mask) if kind == "tree" else None
        return AttentionPlan(batch, None, positions, extra=(kind, ancestors))

    def forward(self, q, k, v, cache: KVCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        """q `[B, Q, Hq, D]`, new k/v `[B, Q, Hkv, D]` → out `[B, Q, Hq, D]`; writes k/v first."""
        batch = plan.batch
        store_new_kv(cache, layer, batch.slots, k, v)
        kind, ancestors = plan.extra
        return invariant_attention(q, cache.k[layer], cache.v[layer], batch.page_table.contiguous(),
                                   batch.prefix_lens.contiguous(), batch.new_lens.contiguous(), scale,
                                   cache.page_size, kind, ancestors)

    def mla_forward(self, q, latent, cache: LatentCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        raise ValueError("batch_invariant does not cover MLA attention (no invariant latent kernel)")
