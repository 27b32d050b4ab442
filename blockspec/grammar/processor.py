"""Structured output on the speculative path: the grammar's token mask as a per-position
logits processor (`blockspec/speculative/logits_processing.py`), and the draft cut before verification.

Every verify position (node i of the step's tree: the root, or a draft node) gets the mask of
the grammar state after the committed output followed by the draft path root → i: each
request's matcher is advanced along every path of the tree and rolled back to its committed
state (`RequestGrammar.walk_tree`). The mask applies to the target's logits only, so
verification is exact for the masked target p′ (docs/structured_output.md).

Drafts the grammar forbids are cut before the target forward (`constrain_tree`):
- point-mass drafts (target-only verification: chains, n-gram, DDTree's top-k tree, greedy
  rows) lose the forbidden node and its subtree. The walk samples from p′, which gives a
  forbidden token probability 0, so such a node is never accepted: cutting it changes nothing
  but the work.
- drafts sampled from the drafter's q (`spec_verify="rejection"`) keep the forbidden node and
  lose only its subtree. Rejection sampling rejects it surely (p′(x) = 0), but that rejection
  is what makes the next token come from the residual norm((p′ − q)⁺) and not from p′; cutting
  the node would draw from p′ after a rejection that q made likely, which is biased
  (tests/grammar/test_grammar_exactness.py has the counterexample).

On the drafter's side (`guide_chain`): a constrained row's point-mass DFlash chain is the
drafter's argmax among the allowed tokens, depth by depth, which raises acceptance and is exact
because target-only verification accepts any proposal. Sampled drafts keep the unmasked q
(exact; masking it would need the matcher draw by draw inside the sampler).
"""

from __future__ import annotations

import torch

from blockspec.grammar.mask import mask_logits, prune_tree, unpack_bitmask
from blockspec.grammar.matcher import ALL_ALLOWED
from blockspec.speculative.tree import DraftTree


def nodes_to_keep(allowed: torch.Tensor, parents: torch.Tensor, sampled_drafts: bool) -> torch.Tensor:
    """`[B, W]` bool: the nodes a constrained tree keeps. `allowed [B, W]`: the node's token and
    all its ancestors' are allowed (the root is). Point-mass drafts keep the allowed nodes;
    sampled drafts also keep a forbidden node whose parent is allowed (see the module docstring)."""
    if not sampled_drafts:
        return allowed
    parent_allowed = allowed.gather(1, parents.clamp(min=0)) & (parents >= 0)
    return allowed | parent_allowed


class GrammarProcessor:
    """The engine's grammar processor: rows whose request has `params.structured_output` (and
    so a `seq.grammar` matcher) are masked; other rows pass unchanged."""

    def __init__(self, vocab_size: int):
        self.bitmask_words = -(-vocab_size // 32)  # xgrammar's int32 words per mask row
        self._pending: tuple[DraftTree, torch.Tensor] | None = None  # masks of the tree just cut

    def wants(self, params) -> bool:
        return params.structured_output is not None

    def constrain_tree(self, seqs, tree: DraftTree, sampled_drafts: bool) -> DraftTree:
        """The step's tree with forbidden drafts cut; its masks are kept for `__call__`."""
        node_allowed, bitmask = self._walk(seqs, tree)
        keep = nodes_to_keep(node_allowed.to(tree.parents.device), tree.parents, sampled_drafts)
        pruned = prune_tree(tree, keep)
        self._pending = (pruned, bitmask)
        return pruned

    def guide_chain(self, seqs, draft_logits: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """Point-mass chain drafts `[B, L]` re-chosen for constrained rows: at each depth the
        drafter's argmax among the tokens the grammar allows after the drafts so far
        (`draft_logits [B, L, V]`). Any proposal is exact under target-only verification; this
        one is never cut where the grammar decides the next token, which is most of a JSON
        document's punctuation and keys. Other rows are returned unchanged."""
        rows = [b for b, seq in enumerate(seqs) if getattr(seq, "grammar", None) is not None]
        if not rows:
            return drafts
        guided = drafts.clone()
        host_logits = draft_logits[rows].float().cpu()
        bitmask = torch.full((1, self.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
        vocab = draft_logits.shape[-1]
        chosen = []
        for b, row_logits in zip(rows, host_logits):
            chosen.append(seqs[b].grammar.guided_argmax(row_logits, bitmask, lambda m: unpack_bitmask(m, vocab)[0]))
        guided[rows] = torch.tensor(chosen, dtype=drafts.dtype).to(drafts.device)
        return guided

    def __call__(self, logits: torch.Tensor, positions) -> torch.Tensor:
        """logits `[B, W, V]` masked at every position of `positions.tree`."""
        if self._pending is not None and self._pending[0] is positions.tree:
            bitmask = self._pending[1]
        else:  # a tree that was not cut first (plain decoding, the sample after a prefill)
            bitmask = self._walk(positions.seqs, positions.tree)[1]
        self._pending = None
        B, W = positions.tree.tokens.shape
        allowed = unpack_bitmask(bitmask.to(logits.device).view(B, W, -1), logits.shape[-1])
        return mask_logits(logits, allowed)

    def _walk(self, seqs, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """(allowed nodes `[B, W]` bool, bitmask `[B·W, words]` int32 on the host) of every
        constrained row; unconstrained rows are all-allowed. One device→host copy of the tree."""
        B, W = tree.tokens.shape
        host = torch.stack([tree.tokens, tree.parents]).cpu()
        tokens, parents = host[0].tolist(), host[1].tolist()
        bitmask = torch.full((B * W, self.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
        allowed = torch.ones(B, W, dtype=torch.bool)
        for b, seq in enumerate(seqs):
            grammar = getattr(seq, "grammar", None)
            if grammar is not None:
                allowed[b] = torch.tensor(grammar.walk_tree(tokens[b], parents[b], bitmask, b * W))
        return allowed, bitmask
