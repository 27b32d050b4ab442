"""Forward passes of the target, and nothing else: step inputs in, logits and features out.

Everything here is fixed-shape tensor work on the device (no Python loop over requests, no
host synchronisation), which is what lets the verify forward be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from blockspec.attention.metadata import AttentionBatch
from blockspec.batch import StepInputs
from blockspec.kv.cache import KVCache, compaction_slots
from blockspec.speculative.tree import DraftTree, tree_attention_mask


class ModelRunner:
    """Owns the target model and its K/V cache."""

    def __init__(self, model, cache: KVCache, device: torch.device, capture_layers: tuple[int, ...] = ()):
        self.model = model
        self.cache = cache
        self.device = device
        self.capture_layers = capture_layers

    @torch.inference_mode()
    def prefill(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor | None, AttentionBatch, torch.Tensor]:
        """Cache each row's chunk. Returns the logits after each row's last chunk token `[B, V]`,
        the captured target features `[B, Q, K·H]` (for drafters), the attention batch and the
        positions `[B, Q]`."""
        width = inputs.input_ids.shape[1]
        batch = inputs.attention_batch(width, inputs.new_lens, "causal", slot_counts=inputs.new_lens)
        positions = inputs.positions(width)
        hidden, features = self.model(inputs.input_ids, positions, self.cache, batch, self.capture_layers)
        last = (inputs.new_lens - 1)[:, None, None].expand(-1, 1, hidden.shape[-1])
        return self.model.logits(hidden.gather(1, last))[:, 0], features, batch, positions

    @torch.inference_mode()
    def verify(self, inputs: StepInputs, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over [root, draft nodes] per row → logits `[B, N+1, V]` and features.

        `tree.tokens[:, 0]` is each row's root. All N+1 positions after the prefix are reserved,
        so padding nodes write past the committed length (rolled back afterwards).
        """
        width = tree.width
        mask_kind, new_mask = ("causal", None) if tree.is_chain else ("tree", tree_attention_mask(tree.parents))
        batch = inputs.attention_batch(width, tree.num_nodes + 1, mask_kind, new_mask)
        positions = inputs.prefix_lens[:, None] + tree.depths
        hidden, features = self.model(tree.tokens, positions, self.cache, batch, self.capture_layers)
        return self.model.logits(hidden), features

    def compact(self, inputs: StepInputs, width: int, src: torch.Tensor, keep: torch.Tensor) -> None:
        """Move the accepted path's K/V (offsets `src`, where `keep`) to consecutive positions."""
        page_table = inputs.page_table
        src_slots, dst_slots = compaction_slots(page_table, self.cache.page_size, inputs.prefix_lens, src, keep)
        self.cache.move(src_slots, dst_slots)
