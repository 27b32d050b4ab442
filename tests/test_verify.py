"""Tests of blockspec.speculative.verify: hand-built greedy cases and exact-law (chi-square) checks.

Why the distribution tests prove losslessness. Think of the target as an autoregressive model
over a vocabulary of V = 6 tokens: the distribution of the token after a prefix is p(. | prefix),
and each draft node carries p(. | prefix up to and including that node). Lossless verification
means the committed tokens are distributed exactly as if sampled from the target one at a time:
the first committed token t1 ~ p(. | root), and, when t1 was an accepted draft node a, the next
committed token t2 ~ p(. | a). (When t1 is the bonus, t2 belongs to the next step, whose
distribution depends on a new forward, so there is nothing to check this step.) The tests
therefore compare, over 20,000 independent trials, the law of t1 against p(. | root), and for
each accepted first token a the law of t2 given t1 = a against p(. | a), with a chi-square test
at alpha = 1e-3 (fixed seeds, so the outcome is reproducible). Each test has a biased verifier
as a negative control that must fail the same check, which shows the check has power.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from blockspec.sampling import SamplingParams, SamplingTensors, filtered_probs, sample_from_probs
from blockspec.speculative.verify import (
    VerifyResult,
    verify_chain,
    verify_chain_rejection,
    verify_tree,
)

ALPHA = 1e-3
NUM_TRIALS = 20_000
VOCAB = 6
F64 = torch.float64
from stats_helpers import chi_square_pvalue


# ---------------------------------------------------------------------------------------------
# helpers


def one_hot_rows(argmax_tokens: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Greedy target probabilities [B, N+1, V]: node i's distribution is a point mass."""
    tokens = torch.tensor(argmax_tokens)
    return torch.nn.functional.one_hot(tokens, vocab).float()


def uniforms_like(batch: int, width: int, value: float = 0.5) -> torch.Tensor:
    """Constant float64 uniforms (irrelevant for one-hot rows)."""
    return torch.full((batch, width), value, dtype=F64)


def first_two_token_pvalues(
    result: VerifyResult, t1_law: torch.Tensor, t2_law_given_t1: torch.Tensor
) -> list[float]:
    """p-values of t1 against t1_law [V], and of t2 | (t1 = a accepted) against t2_law_given_t1[a]."""
    t1 = result.committed[:, 0]
    pvalues = [chi_square_pvalue(torch.bincount(t1, minlength=VOCAB), t1_law)]
    accepted_first = result.accept_len >= 1
    for a in range(VOCAB):
        given_a = accepted_first & (t1 == a)
        if int(given_a.sum()) < 500:  # too few trials to say anything about this branch
            continue
        t2 = result.committed[given_a, 1]
        pvalues.append(chi_square_pvalue(torch.bincount(t2, minlength=VOCAB), t2_law_given_t1[a]))
    assert len(pvalues) >= 3, "the setup must exercise at least two accepted branches"
    return pvalues


def random_distributions(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random filtered target distributions over VOCAB tokens (top_k 5, so one token is 0)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, VOCAB, generator=generator) * 1.2
    rows = logits.reshape(-1, VOCAB)
    params = [SamplingParams(temperature=0.9, top_k=5)] * rows.shape[0]
    return filtered_probs(rows, SamplingTensors.from_params(params, "cpu")).reshape(logits.shape)


def double_child_mass(target_probs: torch.Tensor, node_tokens, parents) -> torch.Tensor:
    """Negative control: a verifier that over-accepts, weighting each child's token by 2 at its parent."""
    weights = torch.ones_like(target_probs)
    rows = torch.arange(target_probs.shape[0])
    for node in range(1, target_probs.shape[1]):
        is_child = parents[:, node] >= 0
        weights[rows[is_child], parents[is_child, node], node_tokens[is_child, node]] = 2.0
    boosted = target_probs * weights
    return boosted / boosted.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# greedy, hand-built


def test_chain_greedy_prefix_bonus_and_full_accept():
    argmax = [3, 5, 1, 6]  # target argmax after root, draft 1, draft 2, draft 3
    probs = one_hot_rows([argmax] * 3)
    drafts = torch.tensor([[3, 5, 2], [3, 5, 1], [4, 5, 1]])
    result = verify_chain(probs, drafts, uniforms_like(3, 4))
    assert result.accept_len.tolist() == [2, 3, 0]
    assert result.committed.tolist() == [[3, 5, 1, -1], [3, 5, 1, 6], [3, -1, -1, -1]]
    assert result.path.tolist() == [[0, 1, 2, -1], [0, 1, 2, 3], [0, -1, -1, -1]]


def test_chain_greedy_from_logits_matches_argmax_walk():
    """Greedy chain verification = accept while the draft equals the argmax at its position."""
    generator = torch.Generator().manual_seed(0)
    batch, num_drafts, vocab = 64, 5, 4  # small vocab so that drafts often match
    logits = torch.randn(batch, num_drafts + 1, vocab, generator=generator)
    drafts = torch.randint(vocab, (batch, num_drafts), generator=generator)
    drafts[:, :2] = logits[:, :2].argmax(-1)  # make long accepted runs common
    st = SamplingTensors.from_params([SamplingParams(temperature=0)] * batch, "cpu")
    result = verify_chain(filtered_probs(logits, st), drafts, uniforms_like(batch, num_drafts + 1))
    for b in range(batch):
        expected = []
        for k in range(num_drafts + 1):
            best = int(logits[b, k].argmax())
            expected.append(best)
            if k == num_drafts or int(drafts[b, k]) != best:
                break
        assert result.committed[b, : len(expected)].tolist() == expected
        assert int(result.accept_len[b]) == len(expected) - 1
        assert (result.committed[b, len(expected) :] == -1).all()


def test_chain_num_drafts_ignores_padding():
    probs = one_hot_rows([[3, 5, 1, 6]] * 3)
    drafts = torch.tensor([[3, 5, 1]] * 3)  # every draft would match
    result = verify_chain(probs, drafts, uniforms_like(3, 4), num_drafts=torch.tensor([1, 0, 3]))
    assert result.accept_len.tolist() == [1, 0, 3]
    assert result.committed.tolist() == [[3, 5, -1, -1], [3, -1, -1, -1], [3, 5, 1, 6]]


def tree_example() -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and parents of a small tree with a padding node.

        root ─ n1 (4) ─ n3 (6)
             │        └ n4 (2)
             └ n2 (7) ─ n5 (6)
        n6: padding (token 1, parent -2)
    """
    tokens = torch.tensor([0, 4, 7, 6, 2, 6, 1])
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, -2])
    return tokens, parents


def test_tree_greedy_multiple_children_and_padding():
    tokens, parents = tree_example()
    # Row 0 follows root -> n2 (second child) -> n5; n3 also carries 6 but is not n2's child.
    # At n5 the argmax is 1: only the padding node carries 1, so 1 is the bonus.
    # Row 1 follows root -> n1 -> n3 and stops at n3 (argmax 0, no children).
    # Row 2 stops at the root: argmax 1 is only the padding node's token.
    argmax = [
        [7, 5, 6, 5, 5, 1, 5],
        [4, 6, 5, 0, 5, 5, 5],
        [1, 4, 4, 4, 4, 4, 4],
    ]
    result = verify_tree(one_hot_rows(argmax), tokens.expand(3, -1), parents.expand(3, -1), uniforms_like(3, 4))
    assert result.accept_len.tolist() == [2, 2, 0]
    assert result.path.tolist() == [[0, 2, 5, -1], [0, 1, 3, -1], [0, -1, -1, -1]]
    assert result.committed.tolist() == [[7, 6, 1, -1], [4, 6, 0, -1], [1, -1, -1, -1]]


def test_tree_bonus_at_max_depth_uses_last_uniform():
    tokens = torch.tensor([[0, 2, 3]])
    parents = torch.tensor([[-1, 0, 1]])
    probs = torch.zeros(1, 3, 4)
    probs[0, 0, 2] = probs[0, 1, 3] = 1.0
    probs[0, 2] = torch.tensor([0.0, 0.5, 0.0, 0.5])  # bonus distribution at the depth-2 node
    for last_uniform, bonus in [(0.25, 1), (0.75, 3)]:
        uniforms = torch.tensor([[0.9, 0.9, last_uniform]], dtype=F64)
        result = verify_tree(probs, tokens, parents, uniforms)
        assert result.accept_len.tolist() == [2]
        assert result.committed.tolist() == [[2, 3, bonus]]
        assert result.path.tolist() == [[0, 1, 2]]


def test_stopped_rows_keep_their_state():
    """A row that stopped must not accept later, even if a later uniform would match."""
    probs = torch.zeros(1, 2, 3)
    probs[0, 0] = torch.tensor([0.5, 0.5, 0.0])
    probs[0, 1] = torch.tensor([0.0, 0.0, 1.0])
    tokens, parents = torch.tensor([[0, 1]]), torch.tensor([[-1, 0]])
    # Depth 0 samples token 0 (no child: stop); at depth 1 the root would sample 1 = n1's token.
    uniforms = torch.tensor([[0.2, 0.9, 0.9]], dtype=F64)
    result = verify_tree(probs, tokens, parents, uniforms)
    assert result.accept_len.tolist() == [0]
    assert result.committed.tolist() == [[0, -1, -1]]
    assert result.path.tolist() == [[0, -1, -1]]


def test_rows_are_independent_of_the_batch():
    probs = random_distributions((5, 4), seed=3)
    drafts = torch.randint(VOCAB, (5, 3), generator=torch.Generator().manual_seed(4))
    drafts[:, 0] = probs[:, 0].argmax(-1)
    uniforms = torch.rand(5, 4, dtype=F64, generator=torch.Generator().manual_seed(5))
    together = verify_chain(probs, drafts, uniforms)
    for b in range(5):
        alone = verify_chain(probs[b : b + 1], drafts[b : b + 1], uniforms[b : b + 1])
        assert torch.equal(alone.committed[0], together.committed[b])
        assert torch.equal(alone.path[0], together.path[b])


# ---------------------------------------------------------------------------------------------
# target-only sampling: exact laws


def tree_trials(seed: int):
    """A fixed depth-2 tree with random per-node target distributions, repeated NUM_TRIALS times.

    Root children are the target's ranks 0 and 2 at the root; n1 has ranks 1 and 3 of its own
    distribution as children; n2 has its rank 0. Returns (node_probs [N+1, V], tokens, parents).
    """
    node_probs = random_distributions((6,), seed=seed)
    rank = node_probs.argsort(dim=-1, descending=True)
    tokens = torch.tensor([0, rank[0, 0], rank[0, 2], rank[1, 1], rank[1, 3], rank[2, 0]])
    parents = torch.tensor([-1, 0, 0, 1, 1, 2])
    return node_probs, tokens, parents


def tree_laws(node_probs, tokens, parents) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact target laws: t1 ~ p(. | root); t2 | t1 = token of root child c ~ p(. | c)."""
    t2_given_t1 = torch.zeros(VOCAB, VOCAB)
    for node in range(1, len(tokens)):
        if parents[node] == 0:
            t2_given_t1[tokens[node]] = node_probs[node]
    return node_probs[0], t2_given_t1


@pytest.mark.parametrize("biased", [False, True])
def test_tree_sampling_is_lossless(biased):
    node_probs, tokens, parents = tree_trials(seed=21)
    batch_tokens = tokens.expand(NUM_TRIALS, -1)
    batch_parents = parents.expand(NUM_TRIALS, -1)
    target = node_probs.expand(NUM_TRIALS, -1, -1)
    if biased:
        target = double_child_mass(target, batch_tokens, batch_parents)
    uniforms = torch.rand(NUM_TRIALS, 3, dtype=F64, generator=torch.Generator().manual_seed(22))
    result = verify_tree(target, batch_tokens, batch_parents, uniforms)
    pvalues = first_two_token_pvalues(result, *tree_laws(node_probs, tokens, parents))
    if biased:
        assert min(pvalues) < ALPHA
    else:
        assert min(pvalues) > ALPHA, pvalues


def autoregressive_chain_trials(seed: int, num_drafts: int = 2):
    """Trials of a K = 2 chain under an autoregressive target p and draft model q.

    Per trial, x1 ~ q(. | root) and x2 ~ q(. | x1); the verifier sees p(. | root), p(. | x1),
    p(. | x1, x2) and (for rejection sampling) q(. | root), q(. | x1).
    Returns (p_root [V], p_next [V, V], target_probs, draft_probs, drafts).
    """
    generator = torch.Generator().manual_seed(seed)
    p_root, p_next, p_next2 = (
        random_distributions((), seed),
        random_distributions((VOCAB,), seed + 1),
        random_distributions((VOCAB, VOCAB), seed + 2),
    )
    q_root, q_next = random_distributions((), seed + 3), random_distributions((VOCAB,), seed + 4)
    draw = torch.rand(NUM_TRIALS, num_drafts, dtype=F64, generator=generator)
    x1 = sample_from_probs(q_root.expand(NUM_TRIALS, -1), draw[:, 0])
    x2 = sample_from_probs(q_next[x1], draw[:, 1])
    target_probs = torch.stack([p_root.expand(NUM_TRIALS, -1), p_next[x1], p_next2[x1, x2]], dim=1)
    draft_probs = torch.stack([q_root.expand(NUM_TRIALS, -1), q_next[x1]], dim=1)
    return p_root, p_next, target_probs, draft_probs, torch.stack([x1, x2], dim=1)


def chain_parents_of(drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Node tokens and parents of a plain chain (for the negative control)."""
    batch, num_drafts = drafts.shape
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), drafts], dim=1)
    parents = (torch.arange(num_drafts + 1) - 1).expand(batch, -1)
    return tokens, parents


@pytest.mark.parametrize("biased", [False, True])
def test_chain_sampling_is_lossless_for_any_drafts(biased):
    """Point-mass drafts from an unrelated q: committed tokens must still follow p exactly."""
    p_root, p_next, target_probs, _, drafts = autoregressive_chain_trials(seed=31)
    if biased:
        target_probs = double_child_mass(target_probs, *chain_parents_of(drafts))
    uniforms = torch.rand(NUM_TRIALS, 3, dtype=F64, generator=torch.Generator().manual_seed(32))
    result = verify_chain(target_probs, drafts, uniforms)
    pvalues = first_two_token_pvalues(result, p_root, p_next)
    if biased:
        assert min(pvalues) < ALPHA
    else:
        assert min(pvalues) > ALPHA, pvalues


# ---------------------------------------------------------------------------------------------
# rejection sampling with draft probabilities


@pytest.mark.parametrize("biased", [False, True])
def test_chain_rejection_is_lossless(biased):
    """Drafts sampled from q != p; accepted with min(1, p/q), residual max(p - q, 0) on reject.

    Given x1 = a accepted, position 2 is a fresh rejection step with x2 ~ q(. | a) and
    independent uniforms, so t2 ~ p(. | a). The negative control is a verifier that believes
    q = p (it passes p as the draft probabilities): it accepts every draft, so t1 follows q.
    """
    p_root, p_next, target_probs, draft_probs, drafts = autoregressive_chain_trials(seed=41)
    assert (draft_probs[0, 0] - target_probs[0, 0]).abs().sum() > 0.3  # q is far from p
    generator = torch.Generator().manual_seed(42)
    accept_uniforms = torch.rand(NUM_TRIALS, 2, dtype=F64, generator=generator)
    residual_uniforms = torch.rand(NUM_TRIALS, 3, dtype=F64, generator=generator)
    claimed_q = target_probs[:, :2] if biased else draft_probs
    result = verify_chain_rejection(target_probs, claimed_q, drafts, accept_uniforms, residual_uniforms)
    pvalues = first_two_token_pvalues(result, p_root, p_next)
    if biased:
        assert min(pvalues) < ALPHA
    else:
        assert min(pvalues) > ALPHA, pvalues


def test_chain_rejection_hand_built():
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 0.5, 0.0, 0.5]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    # Draft token 0: accepted iff u * 0.5 < 0.25, i.e. u < 0.5. Residual after a rejection:
    # max(p - q, 0) = [0, 0, 0.25, 0.25]. Bonus after acceptance: from p[1].
    rows = [
        # (accept u, residual u at 0, residual u at 1) -> (accept_len, committed)
        ((0.49, 0.9, 0.75), (1, [0, 3])),
        ((0.49, 0.9, 0.25), (1, [0, 1])),
        ((0.5, 0.25, 0.9), (0, [2, -1])),
        ((0.9, 0.75, 0.1), (0, [3, -1])),
    ]
    batch = len(rows)
    accept_uniforms = torch.tensor([[r[0][0]] for r in rows], dtype=F64)
    residual_uniforms = torch.tensor([list(r[0][1:]) for r in rows], dtype=F64)
    result = verify_chain_rejection(
        p.expand(batch, -1, -1), q.expand(batch, -1, -1), torch.zeros(batch, 1, dtype=torch.int64),
        accept_uniforms, residual_uniforms,
    )
    assert result.accept_len.tolist() == [r[1][0] for r in rows]
    assert result.committed.tolist() == [r[1][1] for r in rows]
    assert result.path.tolist() == [[0, 1], [0, 1], [0, -1], [0, -1]]


def test_chain_rejection_zero_residual_falls_back_to_p():
    # The draft token has p = q = 0: it is rejected, and max(p - q, 0) is all zero.
    p = q = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]])
    target = torch.cat([p, torch.full((1, 1, 4), 0.25)], dim=1)
    result = verify_chain_rejection(
        target, q, torch.tensor([[3]]), torch.tensor([[0.0]], dtype=F64),
        torch.tensor([[0.75, 0.0]], dtype=F64),
    )
    assert result.accept_len.tolist() == [0]
    assert result.committed.tolist() == [[1, -1]]


def test_chain_rejection_longer_chain_and_no_drafts():
    vocab, num_drafts = 5, 3
    p = torch.full((2, num_drafts + 1, vocab), 0.2)
    q = torch.full((2, num_drafts, vocab), 0.2)  # q = p: every draft passes (u * q < p)
    drafts = torch.tensor([[4, 1, 2], [0, 0, 3]])
    accept_uniforms = torch.tensor([[0.1, 0.5, 0.99], [0.3, 0.3, 0.3]], dtype=F64)
    accept_uniforms[1, 1] = 0.0
    p[1, 1, 0] = 0.0  # ... except row 1's second draft, whose target probability is 0
    p[1, 1] /= p[1, 1].sum()
    residual_uniforms = torch.tensor([[0.0, 0.0, 0.0, 0.99], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    result = verify_chain_rejection(p, q, drafts, accept_uniforms, residual_uniforms)
    assert result.accept_len.tolist() == [3, 1]
    # Row 0: bonus from p_3 with u = 0.99 -> token 4. Row 1: residual max(p1 - q1, 0) is
    # positive on tokens 1..4; u = 0 takes the first of them.
    assert result.committed.tolist() == [[4, 1, 2, 4], [0, 1, -1, -1]]
    assert result.path.tolist() == [[0, 1, 2, 3], [0, 1, -1, -1]]

    empty = verify_chain_rejection(
        p[:, :1], q[:, :0], drafts[:, :0], accept_uniforms[:, :0],
        torch.tensor([[0.5], [0.1]], dtype=F64),
    )
    assert empty.accept_len.tolist() == [0, 0]
    assert empty.committed.tolist() == [[2], [0]]


def test_chain_rejection_cut_chain_equals_the_shorter_chain():
    """num_drafts[b] = k: the row verifies exactly as its first k drafts alone (the bonus at k,
    from p, with that position's uniform); drafts past k are never accepted."""
    gen = torch.Generator().manual_seed(5)
    batch, num_drafts, vocab = 64, 3, 4
    p = torch.softmax(torch.randn(batch, num_drafts + 1, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, num_drafts, vocab, generator=gen), -1)
    drafts = torch.randint(vocab, (batch, num_drafts), generator=gen)
    accept = torch.rand(batch, num_drafts, dtype=F64, generator=gen) * 0.3  # accepts often
    residual = torch.rand(batch, num_drafts + 1, dtype=F64, generator=gen)
    lengths = torch.arange(batch) % (num_drafts + 1)
    cut = verify_chain_rejection(p, q, drafts, accept, residual, lengths)
    for k in range(num_drafts + 1):
        rows = lengths == k
        alone = verify_chain_rejection(p[rows, :k + 1], q[rows, :k], drafts[rows, :k], accept[rows, :k],
                                       residual[rows, :k + 1])
        assert torch.equal(cut.accept_len[rows], alone.accept_len)
        assert torch.equal(cut.committed[rows, :k + 1], alone.committed)
        assert (cut.committed[rows, k + 1:] == -1).all()
    full = verify_chain_rejection(p, q, drafts, accept, residual, torch.full((batch,), num_drafts))
    assert torch.equal(full.committed, verify_chain_rejection(p, q, drafts, accept, residual).committed)


# ---------------------------------------------------------------------------------------------
# no host synchronisation

SYNC_TOKENS = (".item(", ".tolist(", "nonzero", "masked_select", ".cpu(", ".numpy(", "argwhere")


@pytest.mark.parametrize("function", [verify_tree, verify_chain, verify_chain_rejection])
def test_verifiers_have_no_sync_calls_in_source(function):
    source = inspect.getsource(function)
    assert not [token for token in SYNC_TOKENS if token in source]


def test_verifiers_run_on_meta_tensors():
    """Meta tensors have no data: any .item(), bool(), nonzero or boolean indexing raises."""
    meta = dict(device="meta")
    batch, nodes, depth, vocab = 3, 6, 3, 11
    result = verify_tree(
        torch.empty(batch, nodes, vocab, **meta),
        torch.empty(batch, nodes, dtype=torch.int64, **meta),
        torch.empty(batch, nodes, dtype=torch.int64, **meta),
        torch.empty(batch, depth + 1, dtype=F64, **meta),
    )
    assert result.committed.shape == (batch, depth + 1) and result.accept_len.shape == (batch,)
    result = verify_chain(
        torch.empty(batch, 4, vocab, **meta),
        torch.empty(batch, 3, dtype=torch.int64, **meta),
        torch.empty(batch, 4, dtype=F64, **meta),
        torch.empty(batch, dtype=torch.int64, **meta),
    )
    assert result.path.shape == (batch, 4)
    result = verify_chain_rejection(
        torch.empty(batch, 4, vocab, **meta),
        torch.empty(batch, 3, vocab, **meta),
        torch.empty(batch, 3, dtype=torch.int64, **meta),
        torch.empty(batch, 3, dtype=F64, **meta),
        torch.empty(batch, 4, dtype=F64, **meta),
    )
    assert result.committed.shape == (batch, 4) and result.committed.dtype == torch.int64


def test_greedy_walk_equals_the_walk_over_one_hot_probabilities():
    """`verify_tree_greedy` (argmax tokens, no probabilities) is `verify_tree` for greedy rows."""
    from blockspec.speculative.tree import build_tree
    from blockspec.speculative.verify import verify_tree_greedy
    gen = torch.Generator().manual_seed(7)
    B, L, V = 6, 4, 5                                  # a small vocabulary: drafts often match
    tree = build_tree(torch.log_softmax(torch.randn(B, L, V, generator=gen), -1), 9, 3,
                      torch.randint(0, V, (B,), generator=gen))
    logits = torch.randn(B, tree.width, V, generator=gen)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), V).float()
    uniforms = torch.rand(B, L + 1, generator=gen, dtype=torch.float64)
    want = verify_tree(one_hot, tree.tokens, tree.parents, uniforms)
    got = verify_tree_greedy(logits.argmax(-1), tree.tokens, tree.parents, L)
    assert want.accept_len.sum() > 0                   # the trees were walked, not just rooted
    for field in ("accept_len", "path", "committed"):
        assert torch.equal(getattr(got, field), getattr(want, field))


@pytest.mark.parametrize("seed", range(4))
def test_greedy_chain_shortcut_equals_the_walk(seed):
    """Chains: the run of leading matches is the walk (padded chains, full acceptance, none)."""
    from blockspec.speculative.tree import chain_tree
    from blockspec.speculative.verify import verify_tree_greedy
    gen = torch.Generator().manual_seed(seed)
    B, K, V = 8, 5, 3                                  # V = 3: drafts match often
    tree = chain_tree(torch.randint(0, V, (B, K), generator=gen), torch.zeros(B, dtype=torch.long),
                      torch.randint(0, K + 1, (B,), generator=gen))
    target = torch.randint(0, V, (B, K + 1), generator=gen)
    target[0, :K] = tree.tokens[0, 1:]                 # row 0 accepts everything it drafted
    walk = verify_tree_greedy(target, tree.tokens, tree.parents, K, is_chain=False)
    fast = verify_tree_greedy(target, tree.tokens, tree.parents, K, is_chain=True)
    assert walk.accept_len[0] == tree.num_nodes[0]
    for field in ("accept_len", "path", "committed"):
        assert torch.equal(getattr(fast, field), getattr(walk, field))
