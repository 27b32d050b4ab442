"""Drafters as the engine sees them: propose a tree per step, learn from what was committed.

`propose(seqs, roots, uniforms)` returns `(tree, draft_probs)`: draft_probs is None for
point-mass drafts (verified target-only) and the filtered draft distribution q `[B, L, V]`
when the drafts were sampled from q (verified by rejection sampling).

Each proposer has static sizes so that every step has the same shapes:
  max_depth   L: deepest draft node; a verify step draws L + 1 uniforms per request
  max_nodes   N: draft nodes per request (verify width N + 1)
  block_size  drafter cache positions a step writes past the committed length
"""

from __future__ import annotations

import torch

from blockspec.attention.metadata import AttentionBatch, full_new_mask
from blockspec.engine.runner import StepResult, page_table_tensor, slots_for
from blockspec.engine.sequence import Sequence
from blockspec.kv.cache import KVCache
from blockspec.sampling import SamplingTensors, filtered_probs, sample_from_probs
from blockspec.speculative.ngram import propose_ngram_batch
from blockspec.speculative.tree import DraftTree, build_tree, chain_tree


class Proposer:
    """The interface the engine drives; hooks a drafter needs no state for are no-ops.

    load(engine)                 load weights, fix max_depth / max_nodes / block_size
    allocate_cache(target_cache) make any cache that shares the target's pages
    on_prefill(seqs, features, batch, positions)   committed prompt chunks' target features
    propose(seqs, roots, uniforms) -> (DraftTree, draft_probs | None)
    on_verify(seqs, step, path_features)           the committed path's target features
    """

    target_layer_ids: tuple[int, ...] = ()
    block_size = 0
    max_depth = 0
    max_nodes = 0

    def load(self, engine) -> None:
        pass

    def allocate_cache(self, target_cache: KVCache) -> None:
        pass

    def on_prefill(self, seqs, features, batch, positions) -> None:
        pass

    def propose(self, seqs: list[Sequence], roots: torch.Tensor, uniforms=None):
        raise NotImplementedError

    def on_verify(self, seqs, step: StepResult, path_features) -> None:
        pass


class NgramProposer(Proposer):
    """Prompt lookup: continue the most recent earlier match of the last n tokens."""

    def __init__(self, num_draft: int, max_ngram: int = 3):
        self.max_depth = self.max_nodes = num_draft
        self.max_ngram = max_ngram

    def propose(self, seqs: list[Sequence], roots: torch.Tensor, uniforms=None):
        drafts, counts = propose_ngram_batch([s.tokens for s in seqs], self.max_nodes, self.max_ngram)
        return chain_tree(drafts, roots, counts), None


class DFlashProposer(Proposer):
    """Linear DFlash (a chain of argmax drafts) or DDTree (a best-first tree) from one drafter pass."""

    def __init__(self, draft_dir: str, block_size: int | None, tree_budget: int | None = None,
                 tree_topk: int | None = None, sample_drafts: bool = False):
        """`sample_drafts`: draw drafts from the filtered drafter distribution q (chains only)."""
        if sample_drafts and tree_budget is not None:
            raise ValueError("rejection verification (sampled drafts) is for chains; ddtree verifies target-only")
        self.sample_drafts = sample_drafts
        self.draft_dir = draft_dir
        self.requested_block_size = block_size
        self.tree_budget = tree_budget
        self.tree_topk = tree_topk

    def load(self, engine) -> None:
        from blockspec.models.dflash import load_drafter
        from blockspec.models.loader import parse_dtype
        dtype = parse_dtype(engine.config.dtype)
        self.drafter = load_drafter(self.draft_dir, engine.model_config, dtype, engine.device)
        cfg = self.drafter.config
        trained = cfg.block_size
        self.block_size = self.requested_block_size or trained
        if not 2 <= self.block_size <= trained:
            raise ValueError(f"block_size must be between 2 and the drafter's trained block size {trained}, "
                             f"got {self.block_size}")
        self.max_depth = self.block_size - 1
        self.max_nodes = self.tree_budget if self.tree_budget is not None else self.max_depth
        self.target = engine.model
        self.device = engine.device
        self.mask_token_id = cfg.mask_token_id
        self.dtype = dtype

    def allocate_cache(self, target_cache: KVCache) -> None:
        """The drafter's context cache shares the target's pages (same slots, own tensors)."""
        cfg = self.drafter.config
        self.cache = KVCache(cfg.num_layers, target_cache.num_pages, target_cache.page_size,
                             cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device)

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.config.target_layer_ids

    @torch.inference_mode()
    def on_prefill(self, seqs, features, batch: AttentionBatch, positions) -> None:
        self.drafter.write_context(features, positions, batch.slots, self.cache)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], roots: torch.Tensor, uniforms: torch.Tensor | None = None):
        dev, S = self.device, self.block_size
        prefix = [s.num_cached for s in seqs]
        block = torch.full((len(seqs), S), self.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = roots.to(dev)
        prefix_t = torch.tensor(prefix, device=dev)
        batch = AttentionBatch(
            slots=slots_for(seqs, prefix, [S] * len(seqs), S, dev),
            page_table=page_table_tensor(seqs, dev),
            prefix_lens=prefix_t,
            new_lens=torch.full((len(seqs),), S, device=dev),
            new_mask=full_new_mask(len(seqs), S, dev),
        )
        positions = prefix_t[:, None] + torch.arange(S, device=dev)
        hidden = self.drafter(self.target.embed(block), positions, self.cache, batch)
        logits = self.target.logits(hidden[:, 1:])                     # [B, L, V]
        if self.sample_drafts:
            q = filtered_probs(logits, SamplingTensors.from_params([s.params for s in seqs], dev))
            drafts = sample_from_probs(q, uniforms[:, :self.max_depth].to(dev))
            return chain_tree(drafts.cpu(), roots), q
        if self.tree_budget is None:
            return chain_tree(logits.argmax(-1).cpu(), roots), None
        return build_tree(torch.log_softmax(logits, -1), self.tree_budget, self.tree_topk, roots), None

    @torch.inference_mode()
    def on_verify(self, seqs: list[Sequence], step: StepResult, path_features: torch.Tensor) -> None:
        """Append the committed root + accepted nodes' features to the drafter's context."""
        dev = self.device
        width = path_features.shape[1]
        prefix = [s.num_cached for s in seqs]
        counts = [a + 1 for a in step.accepted]
        slots = slots_for(seqs, prefix, counts, width, dev)
        positions = torch.tensor(prefix, device=dev)[:, None] + torch.arange(width, device=dev)
        self.drafter.write_context(path_features, positions, slots, self.cache)


def build_proposer(config):
    """The proposer for `config.spec`, or a clear error when it cannot be honoured."""
    if config.spec == "ngram":
        if config.spec_verify == "rejection":
            raise ValueError("spec_verify 'rejection' needs sampled drafts; n-gram drafts are point masses")
        if config.draft_model:
            raise ValueError("spec 'ngram' uses no draft model; drop --draft-model")
        block = config.block_size or 8
        if block < 2:
            raise ValueError("block_size must be at least 2 for speculative decoding")
        return NgramProposer(num_draft=block - 1)
    if config.spec in ("dflash", "ddtree"):
        if not config.draft_model:
            raise ValueError(f"spec {config.spec!r} needs a draft model (draft_model / --draft-model)")
        if config.spec == "dflash":
            return DFlashProposer(config.draft_model, config.block_size,
                                  sample_drafts=config.spec_verify == "rejection")
        if config.spec_verify == "rejection":
            raise ValueError("spec_verify 'rejection' needs sampled chain drafts: use spec 'dflash'")
        return DFlashProposer(config.draft_model, config.block_size, config.tree_budget or 16, config.tree_topk)
    raise ValueError(f"unknown spec {config.spec!r}")
