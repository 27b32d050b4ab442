"""The CUDA backend: new K/V written by one Triton launch (`attention/triton_kv_write.py`),
attention by the Triton kernel (`attention/triton_paged.py`), which reads each row's pages in
place through the page table; MLA by `attention/triton_mla.py` over the latent cache."""

from __future__ import annotations

import torch

from blockspec.attention.backend import AttentionBackend, AttentionPlan
from blockspec.attention.metadata import AttentionBatch
from blockspec.attention.triton_kv_write import store_new_kv
from blockspec.attention.triton_mla import mla_paged_attention
from blockspec.attention.triton_paged import pack_tree_mask, paged_attention
from blockspec.kv.cache import KVCache, LatentCache


class TritonBackend(AttentionBackend):
    name = "triton"

    def plan(self, batch: AttentionBatch, cache: KVCache, sliding_window: int | None = None,
             causal: bool = False, positions: torch.Tensor | None = None) -> AttentionPlan:
        kind, new_mask = batch.mask_for(causal)
        if kind == "tree" and not isinstance(cache, LatentCache):
            # Packed once a forward for every layer's paged kernel (the MLA kernel reads bools).
            new_mask = pack_tree_mask(new_mask)
        return AttentionPlan(batch, sliding_window, positions, extra=(kind, new_mask))

    def forward(self, q, k, v, cache: KVCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        batch = plan.batch
        store_new_kv(cache, layer, batch.slots, k, v)
        kind, new_mask = plan.extra
        # The kernel indexes these by row with unit stride: views of packed host copies are not.
        return paged_attention(q, cache.k[layer], cache.v[layer], batch.page_table.contiguous(),
                               batch.prefix_lens.contiguous(), batch.new_lens.contiguous(), scale, cache.page_size,
                               kind, new_mask, plan.sliding_window, plan.positions)

    def mla_forward(self, q, latent, cache: LatentCache, layer: int, plan: AttentionPlan, scale: float) -> torch.Tensor:
        batch = plan.batch
        cache.write(layer, batch.slots, latent)
        kind, new_mask = plan.extra
        if plan.sliding_window is not None:
            raise ValueError("MLA attention has no sliding window")
        return mla_paged_attention(q, cache.latent[layer], batch.page_table.contiguous(), batch.prefix_lens.contiguous(),
                                   batch.new_lens.contiguous(), scale, cache.page_size, cache.latent_dim, kind, new_mask)
