"""Sampled trees and their verification by recursive rejection sampling (docs/verification.md).

The drafting side: `draw_excluding` is the inverse-CDF draw of a renormalised q with tokens
removed, `sample_children` gives each node's children as draws without replacement from q.
The verifying side: `verify_sampled_tree` is checked like tests/test_verify.py checks the other
verifiers, by the exact law of an autoregressive target over V = 6 tokens: over 20,000 trials
of one tree shape, every committed token must follow p given the committed prefix (chi-square,
α = 1e-3), and two deliberately wrong rules (no renormalisation of q after removing the drawn
siblings; no subtraction of q from the residual) must fail the same check.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

import blockspec.speculative.verify as verify_module
from blockspec.sampling import SamplingParams, SamplingTensors, filtered_probs, sample_from_probs
from blockspec.speculative.sampled_tree import draw_excluding, fill_with_samples, sample_children, sibling_positions
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree
from blockspec.speculative.verify import verify_sampled_tree
from stats_helpers import chi_square_pvalue

ALPHA = 1e-3
NUM_TRIALS = 20_000
VOCAB = 6
F64 = torch.float64

# A shape with three levels: the root has children 1, 2, 3; node 1 has 4, 5; node 2 has 6;
# node 4 has 7. Siblings are in draw order (index order).
PARENTS = [ROOT_PARENT, 0, 0, 0, 1, 1, 2, 4]
DEPTHS = [0, 1, 1, 1, 2, 2, 2, 3]


def distributions(shape, seed: int, top_k: int = 5, temperature: float = 0.9) -> torch.Tensor:
    """Random filtered distributions over VOCAB tokens (top_k < VOCAB leaves zeros)."""
    logits = torch.randn(*shape, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.2
    rows = logits.reshape(-1, VOCAB)
    params = [SamplingParams(temperature=temperature, top_k=top_k)] * rows.shape[0]
    return filtered_probs(rows, SamplingTensors.from_params(params, "cpu")).reshape(logits.shape)


# ---------------------------------------------------------------------------------------------
# drawing without replacement


def test_draw_excluding_equals_the_draw_from_the_masked_distribution():
    """Same token as zeroing the removed tokens and drawing by inverse CDF (sample_from_probs)."""
    gen = torch.Generator().manual_seed(0)
    B, L, M, V = 64, 3, 5, 9
    q = torch.softmax(torch.randn(B, L, V, generator=gen) * 2, -1)
    q[:, :, 4] = 0.0                                         # a zero-probability token
    q = q / q.sum(-1, keepdim=True)
    depth_index = torch.randint(0, L, (B, M), generator=gen)
    for num_removed in (0, 1, 3):
        removed = torch.stack([torch.randperm(V, generator=gen)[:num_removed].sort().values
                               for _ in range(B * M)]).reshape(B, M, num_removed)
        removed[:, 0, -1:] = V                                # some queries remove one fewer
        removed = removed.sort(-1).values
        q_rows = q[torch.arange(B)[:, None], depth_index]     # [B, M, V]
        mass = torch.where(removed < V, q_rows.gather(-1, removed.clamp(max=V - 1)), 0.0).double()
        uniforms = torch.rand(B, M, generator=gen, dtype=F64)
        got = draw_excluding(q.double().cumsum(-1), depth_index, removed, mass, uniforms)
        # Zero the removed tokens (the V sentinel lands in an extra column, then dropped).
        masked = torch.cat([q_rows, torch.zeros(B, M, 1)], -1).scatter(-1, removed, 0.0)[..., :V]
        want = sample_from_probs(masked, uniforms)
        assert torch.equal(got, want), num_removed
        assert not (removed == got[..., None]).any() and (q_rows.gather(-1, got[..., None]) > 0).all()


def test_draw_excluding_refuses_when_nothing_is_left():
    q = torch.tensor([[[0.5, 0.5, 0.0]]], dtype=F64)
    removed = torch.tensor([[[0, 1]]])
    got = draw_excluding(q.cumsum(-1), torch.zeros(1, 1, dtype=torch.long), removed,
                         torch.tensor([[[0.5, 0.5]]], dtype=F64), torch.tensor([[0.3]], dtype=F64))
    assert got.tolist() == [[3]]                             # V: no draw


def test_children_follow_the_law_of_draws_without_replacement():
    """The (first, second) children of the root are distributed as ordered draws without
    replacement from q_1: P(a, b) = q(a) q(b) / (1 − q(a))."""
    q = distributions((3,), seed=3)                          # q_1, q_2, q_3 (one zero each)
    parents = torch.tensor([PARENTS]).expand(NUM_TRIALS, -1)
    depths = torch.tensor([DEPTHS]).expand(NUM_TRIALS, -1)
    uniforms = torch.rand(NUM_TRIALS, len(PARENTS) - 1, generator=torch.Generator().manual_seed(4), dtype=F64)
    tokens, drawn = sample_children(parents, depths, q.expand(NUM_TRIALS, -1, -1), uniforms)
    assert drawn.all()
    first, second, third = tokens[:, 1], tokens[:, 2], tokens[:, 3]
    assert ((first != second) & (first != third) & (second != third)).all()
    assert ((tokens[:, 4] != tokens[:, 5])).all()
    q1 = q[0].double()
    law = torch.stack([q1[a] * q1 / (1 - q1[a]) for a in range(VOCAB)])
    law[range(VOCAB), range(VOCAB)] = 0.0
    pairs = torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB)
    assert chi_square_pvalue(pairs, law.flatten()) > ALPHA
    # Node 6 (only child of node 2) is a fresh draw from q_2, whatever its parent drew.
    assert chi_square_pvalue(torch.bincount(tokens[:, 6], minlength=VOCAB), q[1]) > ALPHA


def test_children_beyond_the_support_are_not_drawn_and_become_padding():
    q = distributions((3,), seed=5, top_k=2)                # two tokens per depth
    tree = DraftTree(torch.zeros(4, len(PARENTS), dtype=torch.long), torch.tensor([PARENTS] * 4),
                     torch.tensor([DEPTHS] * 4), torch.full((4,), len(PARENTS) - 1), torch.zeros(4, len(PARENTS)), 3)
    uniforms = torch.rand(4, len(PARENTS) - 1, generator=torch.Generator().manual_seed(6), dtype=F64)
    sampled_rows = torch.tensor([True, True, True, False])
    filled = fill_with_samples(tree, q.expand(4, -1, -1), uniforms, sampled_rows)
    # Node 3 is the root's third child: q_1 has two tokens, so it and nothing else is padding.
    assert filled.parents[:3, 3].tolist() == [PAD_PARENT] * 3 and filled.tokens[:3, 3].tolist() == [0] * 3
    assert filled.num_nodes.tolist() == [6, 6, 6, 7]
    assert torch.equal(filled.parents[3], tree.parents[3]) and torch.equal(filled.tokens[3], tree.tokens[3])
    assert (filled.tokens[:3, 1] != filled.tokens[:3, 2]).all()


def test_an_undrawable_node_takes_its_subtree_with_it():
    q = torch.tensor([[1.0, 0, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0]])[None]  # q_1 a point mass
    parents = torch.tensor([[ROOT_PARENT, 0, 0, 2, 1]])
    depths = torch.tensor([[0, 1, 1, 2, 2]])
    tree = DraftTree(torch.zeros(1, 5, dtype=torch.long), parents, depths, torch.tensor([4]), torch.zeros(1, 5), 2)
    filled = fill_with_samples(tree, q, torch.full((1, 4), 0.5, dtype=F64), torch.tensor([True]))
    assert filled.parents.tolist() == [[ROOT_PARENT, 0, PAD_PARENT, PAD_PARENT, 1]]
    assert filled.tokens[0, 1] == 0 and filled.num_nodes.tolist() == [2]


# ---------------------------------------------------------------------------------------------
# verification: exact law


def autoregressive_target(seed: int):
    """p(. | prefix) for prefixes of length 0…3: [V], [V, V], [V, V, V], [V, V, V, V]."""
    return [distributions((VOCAB,) * k, seed + k) for k in range(4)]


def node_target_probs(tokens: torch.Tensor, parents: torch.Tensor, laws) -> torch.Tensor:
    """p after each node of each trial's tree `[T, W, V]`, from its path's tokens."""
    T, W = tokens.shape
    out = torch.empty(T, W, VOCAB)
    prefix: list[list[torch.Tensor]] = []
    for node in range(W):
        parent = int(parents[0, node])
        prefix.append([] if parent < 0 else prefix[parent] + [tokens[:, node]])
        k = len(prefix[node])
        out[:, node] = laws[0].expand(T, -1) if k == 0 else laws[k][tuple(prefix[node])]
    return out


def committed_prefix_pvalues(result, laws, max_prefix: int = 2, min_branches: int = 5) -> list[float]:
    """p-value of every committed token against p(. | the accepted tokens before it), for each
    accepted prefix seen in ≥ 500 trials (the bonus of a step is covered: it is the committed
    token after the accepted prefix)."""
    pvalues = []
    for k in range(max_prefix + 1):
        for prefix in itertools.product(range(VOCAB), repeat=k):
            mask = result.accept_len >= k
            for i, t in enumerate(prefix):
                mask = mask & (result.committed[:, i] == t)
            if int(mask.sum()) < 500:
                continue
            law = laws[k]
            for t in prefix:
                law = law[t]
            pvalues.append(chi_square_pvalue(torch.bincount(result.committed[mask, k], minlength=VOCAB), law))
    assert len(pvalues) >= min_branches, "the setup must exercise several accepted branches"
    return pvalues


def sampled_tree_trials(seed: int, q_top_k: int = 5, q_temperature: float = 1.4):
    laws = autoregressive_target(seed)
    q = distributions((3,), seed + 10, top_k=q_top_k, temperature=q_temperature).expand(NUM_TRIALS, -1, -1)
    gen = torch.Generator().manual_seed(seed + 20)
    W = len(PARENTS)
    tree = DraftTree(torch.zeros(NUM_TRIALS, W, dtype=torch.long), torch.tensor([PARENTS]).expand(NUM_TRIALS, -1),
                     torch.tensor([DEPTHS]).expand(NUM_TRIALS, -1), torch.full((NUM_TRIALS,), W - 1),
                     torch.zeros(NUM_TRIALS, W), 3)
    draw_uniforms = torch.rand(NUM_TRIALS, W - 1, generator=gen, dtype=F64)
    tree = fill_with_samples(tree, q, draw_uniforms, torch.ones(NUM_TRIALS, dtype=torch.bool))
    target = node_target_probs(tree.tokens, torch.tensor([PARENTS]), laws)
    accept_uniforms = torch.rand(NUM_TRIALS, W - 1, generator=gen, dtype=F64)
    bonus_uniforms = torch.rand(NUM_TRIALS, generator=gen, dtype=F64)
    return laws, lambda: verify_sampled_tree(target, q, tree.tokens, tree.parents, accept_uniforms,
                                             bonus_uniforms, 3)


def unrenormalised_proposal(remaining_q):
    """Wrong: q with the drawn siblings removed but not renormalised (over-accepts)."""
    return remaining_q


def residual_without_subtraction(residual, proposal):
    """Wrong: after a rejection keep r instead of norm((r − q)⁺)."""
    return residual


@pytest.mark.parametrize("seed, q_top_k, q_temperature", [(50, 5, 1.4), (50, 3, 0.8), (53, 2, 1.0)])
def test_sampled_tree_verification_is_lossless(seed, q_top_k, q_temperature):
    """q far from p; with top_k 2, q has fewer tokens than the root has children (one undrawable)."""
    laws, verify = sampled_tree_trials(seed=seed, q_top_k=q_top_k, q_temperature=q_temperature)
    result = verify()
    assert int((result.path[:, 1] >= 2).sum()) > 500             # younger siblings really are accepted
    pvalues = committed_prefix_pvalues(result, laws, min_branches=3 if q_top_k == 2 else 5)
    assert min(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize("wrong", ["sibling_proposal", "rejection_residual"])
def test_wrong_residual_rules_fail(wrong, monkeypatch):
    laws, verify = sampled_tree_trials(seed=50)
    bad = {"sibling_proposal": unrenormalised_proposal, "rejection_residual": residual_without_subtraction}[wrong]
    monkeypatch.setattr(verify_module, wrong, bad)
    assert min(committed_prefix_pvalues(verify(), laws)) < ALPHA


def test_hand_built_sibling_sequence():
    """Root children a = 0 then b = 1 drawn from q = (0.5, 0.3, 0.2); p = (0.2, 0.2, 0.6).
    a: accepted iff u · 0.5 < 0.2. Else r = norm((p − q)⁺) = (0, 0, 1): b is rejected whatever
    u (r(b) = 0) and the bonus is token 2."""
    p = torch.tensor([[[0.2, 0.2, 0.6]] * 3] * 2)
    q = torch.tensor([[[0.5, 0.3, 0.2]]] * 2)
    tokens = torch.tensor([[0, 0, 1]] * 2)
    parents = torch.tensor([[ROOT_PARENT, 0, 0]] * 2)
    accept = torch.tensor([[0.3, 0.0], [0.5, 0.0]], dtype=F64)
    result = verify_sampled_tree(p, q, tokens, parents, accept, torch.tensor([0.9, 0.9], dtype=F64), 1)
    assert result.accept_len.tolist() == [1, 0]
    assert result.committed.tolist() == [[0, 2], [2, -1]]
    assert result.path.tolist() == [[0, 1], [0, -1]]


def test_no_host_sync_and_runs_on_meta_tensors():
    for function in (verify_sampled_tree, sample_children, draw_excluding, fill_with_samples):
        source = inspect.getsource(function)
        assert not [s for s in (".item(", ".tolist(", "nonzero", ".cpu(", "masked_select") if s in source]
    meta = dict(device="meta")
    B, W, L, V = 3, 6, 3, 11
    result = verify_sampled_tree(torch.empty(B, W, V, **meta), torch.empty(B, L, V, **meta),
                                 torch.empty(B, W, dtype=torch.long, **meta), torch.empty(B, W, dtype=torch.long, **meta),
                                 torch.empty(B, W - 1, dtype=F64, **meta), torch.empty(B, dtype=F64, **meta), L)
    assert result.committed.shape == (B, L + 1)
    tokens, drawn = sample_children(torch.empty(B, W, dtype=torch.long, **meta), torch.empty(B, W, dtype=torch.long, **meta),
                                    torch.empty(B, L, V, **meta), torch.empty(B, W - 1, dtype=F64, **meta))
    assert tokens.shape == drawn.shape == (B, W)


def test_shape_scores_are_ddtree_scores_floored_outside_the_filtered_support():
    from blockspec.speculative.sampled_tree import SHAPE_FLOOR, shape_scores
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(8))
    q = distributions((2, 3), seed=9, top_k=2)
    scores = shape_scores(logits, q, torch.tensor([True, False]))
    plain = torch.log_softmax(logits, -1)
    assert torch.equal(scores[1], plain[1])                  # greedy row: today's DDTree
    assert torch.equal(scores[0], torch.where(q[0] > 0, plain[0], SHAPE_FLOOR))
    assert (scores[0] > SHAPE_FLOOR).sum(-1).tolist() == [2, 2, 2]


def test_tree_kernel_builds_the_host_shape_from_floored_scores():
    """On CUDA the shape comes from the Triton kernel (here its interpreter): floored scores
    give it the host heap's tree, so sampling after the shape is the same on both paths."""
    from blockspec.speculative.sampled_tree import shape_scores
    from blockspec.speculative.tree import build_tree
    from blockspec.speculative.tree_kernel import build_tree_triton
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits = torch.randn(3, 4, VOCAB, generator=torch.Generator().manual_seed(10))
    q = distributions((3, 4), seed=11, top_k=2)
    scores = shape_scores(logits, q, torch.tensor([True, True, False]))
    want, got = build_tree(scores, 12), build_tree_triton(scores.to(device), 12)
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
    _, position = sibling_positions(want.parents)
    assert position[:2].max() == 1 and position[2].max() > 1    # sampled rows: ≤ 2 children (q's support)


@pytest.mark.parametrize("seeded", [[False, False, False], [True, False, True], [True, True, True]])
@pytest.mark.parametrize("kernel", [False, True])          # torch (CPU), the Triton kernel (its interpreter here)
def test_race_ranked_scores_equal_the_all_rows_formula_and_skip_unseeded_batches(seeded, kernel, monkeypatch):
    """DDTree's seeded rows rank by their race (`race_ranked_scores`): equal to scoring every row
    and keeping the seeded ones (the graph-safe formula the kernel path runs), whether the batch
    has seeded rows or not; on the torch path a batch without seeds runs no race pass at all."""
    import blockspec.speculative.sampled_tree as sampled_tree
    from blockspec.seeded_sampling import race_key, race_scores
    from blockspec.speculative.sampled_tree import SHAPE_FLOOR, race_ranked_scores, shape_scores
    B, L = 3, 4
    logits = torch.randn(B, L, VOCAB, generator=torch.Generator().manual_seed(12))
    q = distributions((B, L), seed=13, top_k=3)
    keys = torch.tensor([race_key(i + 1) if s else 0 for i, s in enumerate(seeded)])
    positions = torch.arange(L)[None, :] + torch.tensor([[5], [9], [2**33]])
    scores = shape_scores(logits, q, torch.ones(B, dtype=torch.bool))
    raced = torch.log_softmax(race_scores(q, keys, positions, kernel=kernel), -1)
    want = torch.where((keys != 0)[:, None, None], raced.clamp(min=SHAPE_FLOOR), scores)
    if not any(seeded) and not kernel:
        monkeypatch.setattr(sampled_tree, "race_scores", lambda *a, **k: pytest.fail("raced a batch without seeds"))
    assert torch.equal(race_ranked_scores(scores.clone(), q, keys, positions, kernel=kernel), want)


def test_a_node_is_kept_iff_it_and_every_ancestor_were_drawn():
    """fill_with_samples' pointer doubling against each node's ancestor chain walked in Python,
    on deep random trees (depth up to 9) with random undrawable nodes."""
    from blockspec.speculative.tree import build_tree
    gen = torch.Generator().manual_seed(4)
    B, L, V = 5, 9, 4
    tree = build_tree(torch.log_softmax(torch.randn(B, L, V, generator=gen) * 3, -1), 40)
    undrawn = (torch.rand(B, tree.width, generator=gen) < 0.12) & (tree.parents >= 0)
    sampled = torch.tensor([True, True, False, True, True])

    def draw(parents, depths, q, uniforms):
        return torch.ones_like(parents), ~undrawn

    out = fill_with_samples(tree, torch.ones(B, L, V) / V, torch.zeros(B, tree.width - 1, dtype=F64), sampled, draw)
    assert int(tree.depths.max()) >= 6
    for b in range(B):
        for i in range(tree.width):
            chain, node = [], i
            while node >= 0:
                chain.append(node)
                node = int(tree.parents[b, node])
            kept = not sampled[b] or not any(bool(undrawn[b, n]) for n in chain)
            assert (int(out.parents[b, i]) != PAD_PARENT) == (kept and int(tree.parents[b, i]) != PAD_PARENT), (b, i)
