"""Lossless verification of drafted tokens against the target distribution (docs/verification.md).

Tree walk: at the current node sample y ~ p (the filtered target distribution of the token
that follows the node) by inverse CDF; if a child of the node carries token y, accept it and
go on, otherwise commit y as the bonus and stop. Each child is accepted with probability
p(child), and the bonus is a draw from p with the children removed, exactly as in the
inverse-CDF-over-children rule (docs/verification.md), so every committed token is an exact
draw from the target. Greedy rows need no special case because their p is one-hot. A chain is a
tree whose nodes have one child each, so `verify_chain` only builds parents.

`verify_chain_rejection` is classic speculative rejection sampling, for drafts that were
sampled from a draft distribution q. `verify_sampled_tree` is its multi-draft form for trees
whose children were drawn from q without replacement (recursive rejection sampling), and
`verify_mixed_tree` picks the rule per row (greedy rows walk).

All functions are vectorised over the batch (Python loops run over depth or tree nodes only), use masks
instead of early exits, and never synchronise with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blockspec.logprobs import PathLogprobs
from blockspec.sampling import sample_from_probs
from blockspec.speculative.tree import PAD_PARENT, DraftTree


@dataclass
class VerifyResult:
    """The outcome of one verify step, per row b (D = max depth, or K for chains).

    accept_len [B] int64: accepted draft nodes (committed tokens = accept_len + 1).
    path [B, D+1] int64: node indices of the accepted path in depth order, path[:, 0] = 0
        (the root), padded with -1.
    committed [B, D+1] int64: accepted tokens followed by the bonus token, padded with -1.
    logprobs: the committed tokens' target log-probabilities, when the step was asked for them
        (`blockspec.logprobs`; set by the step, never by the verifiers).
    """

    accept_len: torch.Tensor
    path: torch.Tensor
    committed: torch.Tensor
    logprobs: "PathLogprobs | None" = None


def verify_tree(
    target_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    parents: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Walk each row's draft tree from the root, accepting children that match target samples.

    target_probs [B, N+1, V]: filtered target distribution following each node (node 0 is the
        root, i.e. the last committed token).
    node_tokens [B, N+1] int64: each node's token (the root's is ignored).
    parents [B, N+1] int64: parent index (< own index); ROOT_PARENT (-1) for the root,
        PAD_PARENT (-2) for padding.
    uniforms [B, D+1] float64: one uniform per depth; all D+1 are used whatever is accepted,
        and a walk that reaches depth D takes its bonus at the depth-D node with uniforms[:, D].
    If two siblings carry the same token, the first one is the one accepted.
    """
    batch = target_probs.shape[0]
    rows = torch.arange(batch, device=target_probs.device)
    uniforms = uniforms.to(device=target_probs.device, dtype=torch.float64)
    return _walk(lambda current, depth: sample_from_probs(target_probs[rows, current], uniforms[:, depth]),
                 node_tokens, parents, uniforms.shape[1] - 1)


def verify_tree_greedy(target_tokens: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                       max_depth: int, is_chain: bool = False) -> VerifyResult:
    """`verify_tree` for a batch whose every row is greedy, from the target's argmax after each
    node `[B, N+1]`: a one-hot p samples its argmax whatever the uniform, so this is the same
    walk without materialising or filtering probabilities. For chains (`is_chain`, N = D) the
    walk is the run of leading matches, found in a few tensor ops instead of one pass a depth."""
    if is_chain and node_tokens.shape[1] == max_depth + 1:
        steps = torch.arange(max_depth + 1, device=node_tokens.device)
        match = (target_tokens[:, :-1] == node_tokens[:, 1:]) & (parents[:, 1:] >= 0)
        accept_len = match.long().cumprod(dim=1).sum(dim=1)
        walked = steps[None, :] <= accept_len[:, None]
        return VerifyResult(accept_len=accept_len, path=torch.where(walked, steps, -1),
                            committed=torch.where(walked, target_tokens, -1))
    rows = torch.arange(target_tokens.shape[0], device=target_tokens.device)
    return _walk(lambda current, depth: target_tokens[rows, current], node_tokens, parents, max_depth)


def _walk(sample, node_tokens: torch.Tensor, parents: torch.Tensor, max_depth: int) -> VerifyResult:
    """The tree walk; `sample(current [B], depth)` is the target's token after each row's node."""
    batch, num_nodes = node_tokens.shape
    device = node_tokens.device
    node_ids = torch.arange(num_nodes, device=device)
    current = torch.zeros(batch, dtype=torch.int64, device=device)
    walking = torch.ones(batch, dtype=torch.bool, device=device)
    accept_len = torch.zeros(batch, dtype=torch.int64, device=device)
    path = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    committed = torch.full_like(path, -1)

    for depth in range(max_depth + 1):
        sampled = sample(current, depth)
        # Accepted or bonus, the committed token at this depth is the sample itself.
        committed[:, depth] = torch.where(walking, sampled, -1)
        if depth == max_depth:
            break
        is_match = (parents == current.unsqueeze(1)) & (node_tokens == sampled.unsqueeze(1))
        first_match = torch.where(is_match, node_ids, num_nodes).amin(dim=1)
        accepted = walking & (first_match < num_nodes)
        path[:, depth + 1] = torch.where(accepted, first_match, -1)
        accept_len += accepted.long()
        current = torch.where(accepted, first_match, current)
        walking = accepted

    return VerifyResult(accept_len=accept_len, path=path, committed=committed)


def chain_parents(
    batch: int, num_drafts_max: int, num_drafts: torch.Tensor | None, device
) -> torch.Tensor:
    """Parents [B, K+1] of a chain: node i's parent is i - 1; nodes past num_drafts[b] pad."""
    positions = torch.arange(num_drafts_max + 1, device=device)
    parents = (positions - 1).unsqueeze(0).expand(batch, -1)
    if num_drafts is None:
        return parents
    is_padding = positions.unsqueeze(0) > num_drafts.to(device).unsqueeze(1)
    return torch.where(is_padding, PAD_PARENT, parents)


def verify_chain(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    num_drafts: torch.Tensor | None = None,
) -> VerifyResult:
    """Target-only verification of a draft chain (point-mass drafts).

    target_probs [B, K+1, V], draft_tokens [B, K] int64, uniforms [B, K+1] float64,
    num_drafts [B] int64 (drafts past it are ignored; None = all K). Greedy rows reduce to
    argmax matching; sampled rows commit exact target samples whatever the drafts were.
    """
    batch, num_drafts_max = draft_tokens.shape
    device = target_probs.device
    root_token = torch.zeros(batch, 1, dtype=torch.int64, device=device)
    node_tokens = torch.cat([root_token, draft_tokens.to(device=device, dtype=torch.int64)], dim=1)
    parents = chain_parents(batch, num_drafts_max, num_drafts, device)
    return verify_tree(target_probs, node_tokens, parents, uniforms)


def verify_chain_rejection(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
    num_drafts: torch.Tensor | None = None,
) -> VerifyResult:
    """Speculative rejection sampling of a chain whose drafts were sampled from q.

    target_probs [B, K+1, V] (p), draft_probs [B, K, V] (q, filtered with the same settings
    as p), draft_tokens [B, K], accept_uniforms [B, K] float64, residual_uniforms [B, K+1]
    float64, num_drafts [B] (a chain cut shorter: drafts at or past it are no drafts; None =
    all K). Draft k is accepted when u_k * q(x_k) < p(x_k), i.e. with probability
    min(1, p/q); at the first rejection the committed token is drawn from
    norm(max(p_k - q_k, 0)) (p_k if that is all zero) with residual_uniforms[:, k]; if every
    draft passes, the bonus is drawn from p at the chain's end with that position's uniform.
    """
    batch, num_positions, _ = target_probs.shape
    max_drafts = num_positions - 1
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    positions = torch.arange(num_positions, device=device)
    draft_tokens = draft_tokens.to(device=device, dtype=torch.int64)

    token_index = draft_tokens.unsqueeze(-1)
    p_of_draft = target_probs[:, :max_drafts].gather(-1, token_index).squeeze(-1).double()
    q_of_draft = draft_probs.gather(-1, token_index).squeeze(-1).double()
    u_accept = accept_uniforms.to(device=device, dtype=torch.float64)
    passes = u_accept * q_of_draft < p_of_draft
    lengths = torch.full((batch,), max_drafts, device=device) if num_drafts is None else num_drafts.to(device)
    real = positions[None, :max_drafts] < lengths[:, None]                  # [B, K]: a draft, not cut
    passes = passes & real
    accept_len = passes.long().cumprod(dim=1).sum(dim=1)  # leading run of passes

    # Position where the non-draft token is drawn: the first rejection, or the chain's end (bonus).
    stop = accept_len
    p_stop = target_probs[rows, stop]
    if max_drafts > 0:
        q_stop = draft_probs[rows, stop.clamp(max=max_drafts - 1)]
        q_stop = torch.where((stop < lengths).unsqueeze(1), q_stop, 0.0)  # a rejection, not the chain's end
    else:
        q_stop = torch.zeros_like(p_stop)
    residual = (p_stop - q_stop).clamp(min=0.0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_stop)
    u_residual = residual_uniforms.to(device=device, dtype=torch.float64)[rows, stop]
    final_token = sample_from_probs(residual, u_residual)

    no_token = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    drafts_padded = torch.cat([draft_tokens, no_token], dim=1)
    is_accepted = positions.unsqueeze(0) < accept_len.unsqueeze(1)
    is_final = positions.unsqueeze(0) == accept_len.unsqueeze(1)
    committed = torch.where(
        is_accepted, drafts_padded, torch.where(is_final, final_token.unsqueeze(1), -1)
    )
    path = torch.where(positions.unsqueeze(0) <= accept_len.unsqueeze(1), positions, -1)
    return VerifyResult(accept_len=accept_len, path=path, committed=committed)


def sibling_proposal(remaining_q: torch.Tensor) -> torch.Tensor:
    """The law a sibling was drawn from: q with its elder siblings' tokens removed (`[B, V]`,
    zeros there), renormalised. Sampling without replacement makes this renormalisation part
    of the rule: testing against the unrenormalised q would over-accept."""
    mass = remaining_q.sum(dim=-1, keepdim=True)
    return remaining_q / mass.clamp(min=torch.finfo(remaining_q.dtype).tiny)


def rejection_residual(residual: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
    """After a rejection: norm((r − q)⁺), `[B, V]`. Where that is all zero the rejection had
    probability 0 (r ≤ q everywhere means r = q); r is kept so nothing divides by zero."""
    left = (residual - proposal).clamp(min=0.0)
    total = left.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, left / total.clamp(min=torch.finfo(left.dtype).tiny), residual)


def verify_sampled_tree(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    node_tokens: torch.Tensor,
    parents: torch.Tensor,
    accept_uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
    max_depth: int,
) -> VerifyResult:
    """Recursive rejection sampling of a tree whose children were sampled from q without
    replacement (`sampled_tree.sample_children`; SpecInfer / SpecTr-style multi-draft).

    target_probs [B, N+1, V] (p after each node), draft_probs [B, L, V] (q of depths 1…L, the
    law a depth-d node's children were drawn from is q[:, d]), node_tokens, parents [B, N+1]
    (siblings in draw order = index order), accept_uniforms [B, N] float64 (node i is tested
    with [:, i − 1]), bonus_uniforms [B] float64, max_depth D (result width D + 1).

    At the current node v the residual r starts as p_v. Its children x_1, x_2, … are tested in
    draw order: x_i is accepted when u · q_i(x_i) < r(x_i), q_i = q with x_1…x_{i−1} removed
    and renormalised (`sibling_proposal`), and the walk moves to it; otherwise
    r ← norm((r − q_i)⁺) (`rejection_residual`) and the next sibling is tested. When no
    sibling is left, the bonus is drawn from r.

    Why it is exact: given that the walk reaches sibling i with residual r (an event fixed by
    the elders' tokens and their own uniforms), x_i is still a draw from q_i, so the token
    committed from here is x_i w.p. q_i(t) min(1, r(t)/q_i(t)) = min(r, q_i)(t), or else, w.p.
    1 − Σ min(r, q_i) = Σ (r − q_i)⁺, a token from norm((r − q_i)⁺): in all min(r, q_i) +
    (r − q_i)⁺ = r. By induction over the siblings (the last step is the bonus draw from r),
    the token committed at v is distributed as p_v, and after accepting x_i the walk restarts
    at a node whose children were drawn independently of everything so far. A rejected x_i has
    r(x_i) < q_i(x_i), so the residual is 0 on it and on every elder: the drawn tokens leave no
    mass behind, the reason sampling without replacement is exact with renormalised q_i.

    One pass per test: each real node is tested at most once and the last pass only ends the
    walk, so N + 1 fixed passes cover every row (no host sync, no per-row Python).
    """
    batch, width, _ = target_probs.shape
    num_depths = draft_probs.shape[1]
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    node_ids = torch.arange(width, device=device)
    steps = torch.arange(max_depth + 1, device=device)
    node_tokens = node_tokens.to(device=device, dtype=torch.int64)
    accept_uniforms = accept_uniforms.to(device=device, dtype=torch.float64)
    node_uniforms = torch.cat([torch.zeros_like(accept_uniforms[:, :1]), accept_uniforms], dim=1)

    current = torch.zeros(batch, dtype=torch.int64, device=device)
    depth = torch.zeros_like(current)
    walking = torch.ones(batch, dtype=torch.bool, device=device)
    tested = torch.zeros(batch, width, dtype=torch.bool, device=device)
    residual = target_probs[:, 0]
    remaining_q = draft_probs[:, 0] if num_depths else torch.zeros_like(residual)
    path = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    committed = torch.full_like(path, -1)

    for _ in range(width):
        candidates = (parents == current[:, None]) & ~tested
        child = torch.where(candidates, node_ids, width).amin(dim=1)
        testing = walking & (child < width)
        walking = testing                               # a row with no child left stops here
        child = child.clamp(max=width - 1)
        token = node_tokens[rows, child]
        proposal = sibling_proposal(remaining_q)
        q_of_token = proposal[rows, token].double()
        accepted = testing & (node_uniforms[rows, child] * q_of_token < residual[rows, token].double())
        rejected = testing & ~accepted

        at_depth = steps[None, :] == depth[:, None]
        committed = torch.where(at_depth & accepted[:, None], token[:, None], committed)
        path = torch.where((steps[None, :] == depth[:, None] + 1) & accepted[:, None], child[:, None], path)
        next_q = draft_probs[rows, (depth + 1).clamp(max=max(num_depths - 1, 0))] if num_depths else remaining_q
        residual = torch.where(accepted[:, None], target_probs[rows, child],
                               torch.where(rejected[:, None], rejection_residual(residual, proposal), residual))
        removed = remaining_q.scatter(1, token[:, None], 0.0)
        remaining_q = torch.where(accepted[:, None], next_q, torch.where(rejected[:, None], removed, remaining_q))
        tested = tested | (rejected[:, None] & (node_ids[None, :] == child[:, None]))
        current = torch.where(accepted, child, current)
        depth = depth + accepted.long()

    # Every row has stopped: its bonus comes from the residual it stopped with.
    bonus = sample_from_probs(residual, bonus_uniforms.to(device=device, dtype=torch.float64))
    committed = torch.where(steps[None, :] == depth[:, None], bonus[:, None], committed)
    return VerifyResult(accept_len=depth.clone(), path=path, committed=committed)


def verify_mixed_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree: DraftTree,
                      uniforms: torch.Tensor, greedy_rows: torch.Tensor, max_depth: int,
                      layout_nodes: int | None = None, greedy_walk=None, sampled_verify=None) -> VerifyResult:
    """The per-request rule for a batch of DDTree trees under `spec_verify="rejection"`:
    greedy rows (`greedy_rows [B]` bool) keep the target-only walk over their top-k tree; the
    others verify their sampled children by recursive rejection sampling.

    target_probs [B, N+1, V], draft_probs [B, L, V], uniforms [B, 2N + 1] laid out
    [draw N | accept N | bonus 1] (the draws were the proposer's). Both rules run on every
    row (fixed shapes); each row keeps its own rule's result. `layout_nodes` (default the
    tree's N) is the N of the uniforms' layout: a tree cut to fewer nodes (adaptive widths)
    reads its accept and bonus uniforms where the full tree's are, never among the draws.
    Greedy rows and seeded rows (p pinned to its race winner: blockspec/seeded_sampling.py) are
    the walked rows. `greedy_walk` and `sampled_verify` default to `verify_tree_greedy` and
    `verify_sampled_tree` (on CUDA the step passes their kernels, `walk_kernel.py`).
    """
    num_nodes = tree.width - 1
    n = num_nodes if layout_nodes is None else layout_nodes
    if n < num_nodes:
        raise ValueError(f"layout_nodes {n} must be at least the tree's {num_nodes} nodes")
    sampled = (sampled_verify or verify_sampled_tree)(target_probs, draft_probs, tree.tokens, tree.parents,
                                  uniforms[:, n:n + num_nodes], uniforms[:, 2 * n], max_depth)
    # A greedy row's p is the one-hot of its argmax, so the walk needs no probabilities.
    walked = (greedy_walk or verify_tree_greedy)(target_probs.argmax(-1), tree.tokens, tree.parents, max_depth)
    greedy_rows = greedy_rows.to(target_probs.device)
    pick = lambda walk, rrs: torch.where(greedy_rows.view(-1, *([1] * (walk.dim() - 1))), walk, rrs)  # noqa: E731
    return VerifyResult(accept_len=pick(walked.accept_len, sampled.accept_len), path=pick(walked.path, sampled.path),
                        committed=pick(walked.committed, sampled.committed))
