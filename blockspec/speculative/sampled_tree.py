"""Sampled DDTree trees (docs/ddtree.md, docs/verification.md): the shape from the drafter's
scores, the tokens drawn from the drafter's distribution q at the row's temperature
(`sampling.tempered_probs`: the truncation filters stay on the target's p).

A sampled row's tree keeps DDTree's best-first shape (`shape_scores`), but the token of each
node is not the rank-r token of its depth: the children of a node are successive draws WITHOUT replacement
from q at the children's depth, the node's sibling position being its draw number. Verification
by recursive rejection sampling (`verify.verify_sampled_tree`) is then exact.

Without replacement, because duplicate siblings would waste budget (most with a peaked q) and
because the residual of a rejected sibling is zero on its token, so no mass is lost. A child
whose draw is impossible (every token of q's support already taken by its elder siblings, or a
float rounding pathology) is made padding together with its subtree: skipping a draw that never
happened is exactly what the verifier would do with it.

Everything is fixed-shape device work with no host sync; the loop runs over sibling positions
(at most the budget), not over rows.
"""

from __future__ import annotations

import torch

from blockspec.seeded_sampling import race_scores, use_kernel
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree

# Log-score of a token outside q's support: below any finite prefix score (a float32 log-prob is
# ≥ −104 per depth, so ≥ −1600 for 15 depths), finite so the best-first search stays ordinary.
SHAPE_FLOOR = -1.0e4


def shape_scores(logits: torch.Tensor, draft_probs: torch.Tensor, sampled_rows: torch.Tensor) -> torch.Tensor:
    """Per-position scores `[B, L, V]` the tree's shape is built from: today's DDTree scores
    (the drafter's unfiltered log-softmax), floored outside the support of a sampled row's q.

    Unfiltered, because a temperature-sharpened q makes too narrow a tree for a drafter less
    sure than its target (docs/ddtree.md); floored outside q's support,
    because a node can have at most as many sampled children as q has tokens, so the budget
    goes to nodes that can be drawn. Greedy rows keep the plain scores (and their top-k tokens).
    `draft_probs [B, L, V]` is q (`sampling.tempered_probs`), `sampled_rows [B]` bool."""
    plain = torch.log_softmax(logits.float(), -1)
    outside = sampled_rows[:, None, None] & (draft_probs <= 0)
    return torch.where(outside, SHAPE_FLOOR, plain)


def race_ranked_scores(scores: torch.Tensor, draft_probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                       kernel: bool | None = None) -> torch.Tensor:
    """`scores [B, L, V]` (`shape_scores`) with each seeded row's (`keys [B]` ≠ 0) replaced by the
    log-softmax of its race scores on q (`seeded_sampling.race_scores`, floored at SHAPE_FLOOR),
    so that its top-k tree is its race's order; in place, returned. `positions [B, L]`: each
    depth's absolute position. The kernel path (CUDA, inside the step's graph: no host sync)
    scores every row and keeps the seeded ones; the torch path (the CPU) scores only the rows
    that race — none, and no [B, L, V] pass, in a batch without seeds."""
    if use_kernel(draft_probs, kernel):
        raced = torch.log_softmax(race_scores(draft_probs, keys, positions, kernel=True), -1)
        return torch.where((keys != 0)[:, None, None], raced.clamp(min=SHAPE_FLOOR), scores)
    rows = (keys != 0).nonzero()[:, 0]
    if rows.numel():
        raced = race_scores(draft_probs[rows], keys[rows], positions[rows], kernel=False)
        scores[rows] = torch.log_softmax(raced, -1).clamp(min=SHAPE_FLOOR)
    return scores


def sibling_positions(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`elder [B, W, W]` bool: j is a real elder sibling of i (same parent, j < i); and each
    node's draw number `[B, W]` (0 for the first child). Best-first pops siblings in rank order,
    so index order is draw order."""
    W = parents.shape[1]
    node = torch.arange(W, device=parents.device)
    elder = ((parents[:, :, None] == parents[:, None, :]) & (parents[:, :, None] >= 0)
             & (node[None, None, :] < node[None, :, None]))
    return elder, elder.sum(-1)


def draw_excluding(cdf: torch.Tensor, depth_index: torch.Tensor, removed: torch.Tensor,
                   removed_mass: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from q with some tokens removed and the rest renormalised.

    cdf [B, L, V] float64: cumulative q per depth; depth_index [B, M] which depth each query
    reads; removed [B, M, R] int64: the removed tokens in ascending order, padded with V;
    removed_mass [B, M, R] float64: their q (0 for padding); uniforms [B, M] float64.
    Returns tokens [B, M] int64, V where no token can be returned (the caller treats it as
    no draw).

    With s_1 < … < s_R removed and Q_j their cumulative mass, the wanted token is the first t
    whose cdf(t) − Σ_{s_j ≤ t} q(s_j) exceeds u · (total − Q_R). On the interval between s_j
    and s_{j+1} that is the first t with cdf(t) > u · (total − Q_R) + Q_j, which one
    searchsorted finds; the answer is the candidate of the first interval that contains its
    own. Exactly a removed or zero-probability token is never the first crossing (only float
    rounding could make it one, and it is then refused).
    """
    B, L, V = cdf.shape
    M, R = removed.shape[1], removed.shape[2]
    start = torch.zeros(B, M, 1, dtype=removed_mass.dtype, device=cdf.device)
    cumulative = torch.cat([start, removed_mass.cumsum(-1)], dim=-1)                                  # [B,M,R+1]
    total = cdf[..., -1].gather(1, depth_index)                                                        # [B, M]
    target = uniforms * (total - cumulative[..., -1])
    thresholds = target[..., None] + cumulative                                                       # [B,M,R+1]
    # One searchsorted over every depth's cdf (queries of other depths are discarded): small
    # queries instead of a [B, M, V] copy of the cdf per node.
    queries = thresholds.reshape(B, 1, M * (R + 1)).expand(B, L, M * (R + 1)).contiguous()
    found = torch.searchsorted(cdf, queries, right=True)                                              # [B,L,M(R+1)]
    found = found.gather(1, depth_index.repeat_interleave(R + 1, dim=1)[:, None, :]).reshape(B, M, R + 1)
    upper = torch.cat([removed, torch.full((B, M, 1), V, dtype=removed.dtype, device=cdf.device)], dim=-1)  # s_{j+1}
    in_interval = found < upper
    first = torch.where(in_interval, torch.arange(R + 1, device=cdf.device), R + 1).amin(-1)
    token = found.gather(-1, first.clamp(max=R)[..., None]).squeeze(-1)
    refused = (first > R) | (token >= V) | (removed == token[..., None]).any(-1)
    return torch.where(refused, V, token)


def sample_children(parents: torch.Tensor, depths: torch.Tensor, draft_probs: torch.Tensor,
                    uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens for every node of a tree shape: each node's children are successive draws without
    replacement from q at their depth.

    parents, depths [B, W]; draft_probs [B, L, V] (q of depths 1…L); uniforms [B, W − 1]
    float64 (node i draws with uniforms[:, i − 1]). Returns tokens [B, W] int64 (0 where there
    is no draw, root included) and drawn [B, W] bool (a real node with a token; the root is
    drawn). A node is not drawn when its elder siblings took all of q's support.
    """
    B, W = parents.shape
    L, V = draft_probs.shape[1], draft_probs.shape[2]
    cdf = draft_probs.double().cumsum(-1)
    support = (draft_probs > 0).sum(-1)                                       # [B, L]
    depth_index = (depths - 1).clamp(0, max(L - 1, 0))
    is_real = parents >= 0
    elder, position = sibling_positions(parents)
    node_uniforms = torch.cat([torch.zeros_like(uniforms[:, :1]), uniforms], dim=1).double()
    can_draw = is_real & (position < support.gather(1, depth_index))
    tokens = torch.full((B, W), V, dtype=torch.int64, device=parents.device)
    num_draws = min(W - 1, V)
    for draw in range(num_draws):
        # Draw number `draw` of every parent; its elder siblings (draws 0…draw−1) are known.
        now = can_draw & (position == draw)
        taken = torch.where(elder, tokens[:, None, :], V)                     # [B, W, W], V = none
        removed = taken.sort(-1).values[..., :draw]                         # ascending, V-padded
        flat = (depth_index[..., None] * V + removed.clamp(max=V - 1)).reshape(B, -1)
        mass = draft_probs.reshape(B, L * V).gather(1, flat).reshape(removed.shape).double()
        mass = torch.where(removed < V, mass, 0.0)
        drawn_now = draw_excluding(cdf, depth_index, removed, mass, node_uniforms)
        tokens = torch.where(now, drawn_now, tokens)
    drawn = (is_real & (tokens < V)) | (parents == ROOT_PARENT)
    return torch.where(tokens < V, tokens, 0), drawn


def fill_with_samples(tree: DraftTree, draft_probs: torch.Tensor, uniforms: torch.Tensor,
                      sampled_rows: torch.Tensor, draw=None) -> DraftTree:
    """The tree with sampled rows' tokens replaced by draws (`draw`, default `sample_children`;
    on CUDA the proposer passes its kernel) and undrawable nodes (and their subtrees) made
    padding; other rows are unchanged. `uniforms [B, W − 1]`, `sampled_rows [B]` bool."""
    tokens, drawn = (draw or sample_children)(tree.parents, tree.depths, draft_probs, uniforms)
    keep = drawn | ~sampled_rows[:, None] | (tree.parents == PAD_PARENT)
    # A node is kept when it and every ancestor are: pointer doubling, so ⌈log2 L⌉ passes
    # (after pass k, `keep` covers the ancestors closer than 2^k and `jump` is the 2^k-th one;
    # −1 is past the root, whose own `keep` stands in, being True).
    jump = tree.parents.clamp(min=-1)
    span = 1
    while span < max(draft_probs.shape[1], 1):
        keep = keep & ((jump < 0) | keep.gather(1, jump.clamp(min=0)))
        jump = torch.where(jump < 0, jump, jump.gather(1, jump.clamp(min=0)))
        span *= 2
    real = keep & (tree.parents >= 0)
    parents = torch.where(keep, tree.parents, PAD_PARENT)
    sampled_tokens = torch.where(real, tokens, 0)
    is_node = torch.arange(tree.width, device=tokens.device)[None, :] > 0
    new_tokens = torch.where(sampled_rows[:, None] & is_node, sampled_tokens, tree.tokens)
    return DraftTree(tokens=new_tokens, parents=parents, depths=torch.where(keep, tree.depths, 0),
                     num_nodes=real.sum(dim=1), logprob=torch.where(keep, tree.logprob, 0.0),
                     max_depth=tree.max_depth, is_chain=tree.is_chain)
