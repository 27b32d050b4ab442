"""Turns scheduled sequences into batch tensors and runs one step of the target.

Everything between building the tensors and the single `.tolist()` at the end of a step is
fixed-shape tensor work: no Python loop over requests, no host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blockspec.attention.metadata import AttentionBatch, causal_new_mask
from blockspec.engine.sequence import Sequence
from blockspec.kv.cache import KVCache, compaction_slots
from blockspec.models.llama import CausalLM
from blockspec.sampling import SamplingTensors, filtered_probs, sample_from_probs
from blockspec.speculative.tree import DraftTree, accepted_kv_indices, tree_attention_mask
from blockspec.speculative.verify import verify_chain_rejection, verify_tree


@dataclass
class StepResult:
    """Per row: committed tokens this step and how many of them were accepted drafts."""

    committed: list[list[int]]
    accepted: list[int]


def _pad(rows: list[list[int]], fill: int, device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def page_table_tensor(seqs: list[Sequence], device) -> torch.Tensor:
    return _pad([s.page_table.pages or [0] for s in seqs], 0, device)


def slots_for(seqs: list[Sequence], starts: list[int], counts: list[int], width: int, device) -> torch.Tensor:
    """Cache slots of positions start … start+count−1 of each row, padded to `width` with slot 0."""
    rows = [[s.page_table.slot(p) for p in range(st, st + n)] + [0] * (width - n)
            for s, st, n in zip(seqs, starts, counts)]
    return torch.tensor(rows, dtype=torch.long, device=device)


class ModelRunner:
    """Owns the target model and its K/V cache; runs prefill and verify steps."""

    def __init__(self, model: CausalLM, cache: KVCache, device: torch.device,
                 capture_layers: tuple[int, ...] = ()):
        self.model = model
        self.cache = cache
        self.device = device
        self.capture_layers = capture_layers

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], chunk_lens: list[int], sample_rows: list[bool],
                uniforms: torch.Tensor) -> tuple[list[int | None], torch.Tensor | None, AttentionBatch, torch.Tensor]:
        """Cache the next `chunk_lens[b]` tokens of each row; sample where `sample_rows[b]`.

        Returns the sampled tokens (None where not sampled), the captured target features
        `[B, Q, K·H]` (for drafters), the attention batch and the positions.
        """
        dev = self.device
        starts = [s.num_cached for s in seqs]
        q = max(chunk_lens)
        input_ids = _pad([s.tokens[st:st + n] for s, st, n in zip(seqs, starts, chunk_lens)], 0, dev)
        positions = _pad([list(range(st, st + n)) for st, n in zip(starts, chunk_lens)], 0, dev)
        batch = AttentionBatch(
            slots=slots_for(seqs, starts, chunk_lens, q, dev),
            page_table=page_table_tensor(seqs, dev),
            prefix_lens=torch.tensor(starts, device=dev),
            new_lens=torch.tensor(chunk_lens, device=dev),
            new_mask=causal_new_mask(len(seqs), q, dev),
        )
        hidden, features = self.model(input_ids, positions, self.cache, batch, self.capture_layers)
        last = (batch.new_lens - 1)[:, None, None].expand(-1, 1, hidden.shape[-1])
        logits = self.model.logits(hidden.gather(1, last))[:, 0]
        st = SamplingTensors.from_params([s.params for s in seqs], dev)
        tokens = sample_from_probs(filtered_probs(logits, st), uniforms[:, 0].to(dev)).tolist()
        return [t if do else None for t, do in zip(tokens, sample_rows)], features, batch, positions

    @torch.inference_mode()
    def verify(self, seqs: list[Sequence], tree: DraftTree, uniforms: torch.Tensor,
               draft_probs: torch.Tensor | None = None,
               ) -> tuple[StepResult, torch.Tensor | None]:
        """One target forward over [root, draft nodes] per row, then the verification walk.

        `tree.tokens[:, 0]` must be each row's last committed token. The accepted path's K/V is
        compacted to positions P … P+a (P = cached length before the step). With `draft_probs`
        (a chain sampled from q) verification is rejection sampling and `uniforms` holds
        [draft L | accept L | residual L+1]; otherwise one uniform per depth. Returns the step
        result and the captured features of the accepted path `[B, D+1, K·H]`.
        """
        dev = self.device
        B, width = tree.tokens.shape
        prefix = [s.num_cached for s in seqs]
        prefix_t = torch.tensor(prefix, device=dev)
        new_lens = tree.num_nodes.to(dev) + 1
        batch = AttentionBatch(
            # All `width` positions are reserved; padding nodes write past the committed length.
            slots=slots_for(seqs, prefix, [width] * B, width, dev),
            page_table=page_table_tensor(seqs, dev),
            prefix_lens=prefix_t,
            new_lens=new_lens,
            new_mask=tree_attention_mask(tree.parents.to(dev)),
        )
        positions = prefix_t[:, None] + tree.depths.to(dev)
        hidden, features = self.model(tree.tokens.to(dev), positions, self.cache, batch, self.capture_layers)
        probs = filtered_probs(self.model.logits(hidden), SamplingTensors.from_params([s.params for s in seqs], dev))
        if draft_probs is None:
            result = verify_tree(probs, tree.tokens.to(dev), tree.parents.to(dev), uniforms.to(dev))
        else:
            L = width - 1
            u = uniforms.to(dev)
            result = verify_chain_rejection(probs, draft_probs, tree.tokens[:, 1:].to(dev),
                                            u[:, L:2 * L], u[:, 2 * L:3 * L + 1])
        src, keep = accepted_kv_indices(result.path, result.accept_len)
        # Any row that branches may accept a path with gaps. (A batch's deepest row being a full
        # chain says nothing about the other rows: each row is checked when the tree is built.)
        if not tree.is_chain:
            src_slots, dst_slots = compaction_slots(batch.page_table, self.cache.page_size, prefix_t, src, keep)
            self.cache.move(src_slots, dst_slots)
        path_features = None
        if features is not None:
            idx = src.clamp(min=0)[:, :, None].expand(-1, -1, features.shape[-1])
            path_features = features.gather(1, idx)
        accept_len = result.accept_len.tolist()
        committed = result.committed.tolist()
        step = StepResult(committed=[row[:a + 1] for row, a in zip(committed, accept_len)], accepted=accept_len)
        return step, path_features
