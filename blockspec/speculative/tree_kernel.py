"""DDTree's best-first search as one Triton program per row: the tree is built where the drafter's
scores are, with no host round trip, so draft → tree → verify is one CUDA graph.

Same search as `tree.build_tree` (the host heap, the reference): a frontier of at most
budget + 1 candidates (pop i frees its slot for the popped node's next sibling and puts its
first child in the fresh slot i + 1), `budget` pops of the highest score with ties to the
earliest push, scores summed in float64 in the same order. So nodes, order and log-probabilities
equal the host version's; `max_depth` is the bound L and `is_chain` False (unknown on the host
without a sync; the verify then always compacts, which is exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree, top_scores

_NEVER = 2 ** 30


@triton.jit
def _best_first_kernel(vals_ptr, idx_ptr, root_ptr, parent_ptr, depth_ptr, rank_ptr, score_ptr, token_ptr,
                       budget, L, K, HAS_ROOT: tl.constexpr, FRONTIER: tl.constexpr, NEVER: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    vals = vals_ptr + b * L * K                        # [L, K] top-k log-probs, descending
    W = budget + 1
    # The root (every output is written here: the caller allocates them uninitialised).
    tl.store(parent_ptr + b * W, -1)
    tl.store(depth_ptr + b * W, 0)
    tl.store(rank_ptr + b * W, 0)
    tl.store(score_ptr + b * W, 0.0)
    if HAS_ROOT:
        tl.store(token_ptr + b * W, tl.load(root_ptr + b).to(tl.int64))
    else:
        tl.store(token_ptr + b * W, 0)
    offs = tl.arange(0, FRONTIER)
    first = tl.load(vals).to(tl.float64)
    valid = offs == 0
    score = tl.where(offs == 0, first, 0.0)
    counter = tl.zeros([FRONTIER], tl.int32)
    depth = tl.full([FRONTIER], 1, tl.int32)
    rank = tl.zeros([FRONTIER], tl.int32)
    parent = tl.zeros([FRONTIER], tl.int32)
    pscore = tl.zeros([FRONTIER], tl.float64)
    pushes = tl.program_id(0) * 0 + 1                  # an int32 scalar, carried by the loop
    for i in range(0, budget):
        has = tl.max(valid.to(tl.int32), axis=0) > 0
        s = tl.where(valid, score, float("-inf"))
        best = tl.max(s, axis=0)
        tied = valid & (s == best)
        earliest = tl.min(tl.where(tied, counter, NEVER), axis=0)
        sel = tied & (counter == earliest)
        has = has & (earliest < NEVER)     # (a popped candidate exists: `top_scores` keeps NaN out)
        s_score = tl.sum(tl.where(sel, score, 0.0), axis=0)
        s_depth = tl.sum(tl.where(sel, depth, 0), axis=0)
        s_rank = tl.sum(tl.where(sel, rank, 0), axis=0)
        s_parent = tl.sum(tl.where(sel, parent, 0), axis=0)
        s_pscore = tl.sum(tl.where(sel, pscore, 0.0), axis=0)
        node = i + 1
        out = b * W + node
        tl.store(parent_ptr + out, tl.where(has, s_parent, -2).to(tl.int64))
        tl.store(depth_ptr + out, tl.where(has, s_depth, 0).to(tl.int64))
        tl.store(rank_ptr + out, tl.where(has, s_rank, 0).to(tl.int64))
        tl.store(score_ptr + out, tl.where(has, s_score, 0.0).to(tl.float32))
        token = tl.load(idx_ptr + b * L * K + (s_depth - 1) * K + s_rank, mask=has, other=0)
        tl.store(token_ptr + out, tl.where(has, token, 0).to(tl.int64))
        # The next sibling takes the popped slot; the first child the fresh slot i + 1.
        sib_ok = has & (s_rank + 1 < K)
        sib_val = tl.load(vals + (s_depth - 1) * K + s_rank + 1, mask=sib_ok, other=0.0).to(tl.float64)
        child_ok = has & (s_depth < L)
        child_val = tl.load(vals + s_depth * K, mask=child_ok, other=0.0).to(tl.float64)
        sib_counter = pushes
        child_counter = pushes + sib_ok.to(tl.int32)
        pushes = child_counter + child_ok.to(tl.int32)
        valid = tl.where(sel, sib_ok, valid)
        score = tl.where(sel, s_pscore + sib_val, score)
        counter = tl.where(sel, sib_counter, counter)
        rank = tl.where(sel, s_rank + 1, rank)
        at = offs == node
        valid = tl.where(at, child_ok, valid)
        score = tl.where(at, s_score + child_val, score)
        counter = tl.where(at, child_counter, counter)
        depth = tl.where(at, s_depth + 1, depth)
        rank = tl.where(at, 0, rank)
        parent = tl.where(at, node, parent)
        pscore = tl.where(at, s_score, pscore)


def build_tree_triton(draft_logprobs: torch.Tensor, budget: int, topk: int | None = None,
                      root_tokens: torch.Tensor | None = None) -> DraftTree:
    """`build_tree`'s tree from `draft_logprobs [B, L, V]`, built by the kernel above."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    B, L, V = draft_logprobs.shape
    device = draft_logprobs.device
    k = min(budget, V, topk if topk is not None else budget)
    width = budget + 1
    if k == 0 or L == 0:    # just the root (and padding)
        parents = torch.full((B, width), PAD_PARENT, dtype=torch.int64, device=device)
        parents[:, 0] = ROOT_PARENT
        tokens = torch.zeros(B, width, dtype=torch.int64, device=device)
        if root_tokens is not None:
            tokens[:, 0] = root_tokens.to(device=device, dtype=torch.int64)
        zeros = torch.zeros(B, width, dtype=torch.int64, device=device)
        return DraftTree(tokens, parents, zeros, (parents >= 0).sum(dim=1), torch.zeros(B, width, device=device),
                         max_depth=L, is_chain=False)
    # Every output is written by the kernel (root, nodes, padding): no fills before it.
    parents, depths, ranks, tokens = (torch.empty(B, width, dtype=torch.int64, device=device) for _ in range(4))
    logprob = torch.empty(B, width, dtype=torch.float32, device=device)
    top_vals, top_idx = top_scores(draft_logprobs, k)                           # [B, L, K]
    roots = root_tokens.to(device) if root_tokens is not None else top_idx      # (unread without roots)
    _best_first_kernel[(B,)](top_vals.contiguous(), top_idx.contiguous(), roots, parents, depths, ranks, logprob,
                             tokens, budget, L, k, HAS_ROOT=root_tokens is not None,
                             FRONTIER=triton.next_power_of_2(width), NEVER=_NEVER)
    return DraftTree(tokens, parents, depths, (parents >= 0).sum(dim=1), logprob, max_depth=L, is_chain=False)
