"""Grammar masks as tensor math (pure functions, device-agnostic).

The mask is a processor on the target's logits: a forbidden token's logit becomes −inf, so
every filter (temperature, top-k, top-p, min-p) and every verifier then works on the masked
target distribution p′ = norm(p · allowed), and speculative verification stays exact for p′.
"""

from __future__ import annotations

import torch

from blockspec.speculative.tree import PAD_PARENT, DraftTree


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar bitmask `[..., W]` int32 (bit t % 32 of word t // 32 = token t allowed) →
    bool `[..., vocab_size]`."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1                  # arithmetic shift: & 1 keeps one bit
    return bits.bool().flatten(-2)[..., :vocab_size]


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits `[B, W, V]` with forbidden tokens (`allowed [B, W, V]` False) at −inf. Every row
    must allow at least one token (the caller fills rows it never samples from as all-allowed)."""
    return logits.masked_fill(~allowed, float("-inf"))


def prune_tree(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The tree with nodes not in `keep [B, W]` bool made padding (the root is always kept; a
    kept node's ancestors must be kept, which the grammar walk guarantees). A chain stays a
    chain: only a suffix of it is cut."""
    keep = keep.to(tree.parents.device).clone()
    keep[:, 0] = True
    keep &= tree.parents != PAD_PARENT
    parents = torch.where(keep, tree.parents, PAD_PARENT)
    real = keep.clone()
    real[:, 0] = False
    return DraftTree(tokens=torch.where(keep, tree.tokens, 0), parents=parents,
                     depths=torch.where(keep, tree.depths, 0), num_nodes=real.sum(dim=1),
                     logprob=torch.where(keep, tree.logprob, 0.0), max_depth=tree.max_depth,
                     is_chain=tree.is_chain)
