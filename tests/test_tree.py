"""Draft-tree construction, masks, chain trees and compaction indices vs brute force."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

from blockspec.speculative.tree import (PAD_PARENT, ROOT_PARENT, accepted_kv_indices, build_tree, chain_tree,
                                        tree_attention_mask, tree_positions, with_rows)


def random_logprobs(batch: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    """Tie-free random per-position log-probabilities [B, L, V]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(batch, depth, vocab, generator=gen) * 2.0, dim=-1)


def brute_force_best(logq: torch.Tensor, budget: int, topk: int | None = None) -> list[tuple[int, ...]]:
    """Enumerate every prefix (restricted to each depth's top-k tokens) and keep the best `budget`."""
    rows = logq.tolist()
    allowed = []
    for position in rows:
        order = sorted(range(len(position)), key=lambda t: -position[t])
        allowed.append(order[:topk] if topk is not None else order)
    scored = []
    for d in range(1, len(rows) + 1):
        for prefix in itertools.product(*allowed[:d]):
            scored.append((sum(rows[i][t] for i, t in enumerate(prefix)), prefix))
    scored.sort(key=lambda item: -item[0])
    return [prefix for _, prefix in scored[:budget]]


def tree_prefixes(tree, row: int) -> list[tuple[int, ...]]:
    """Token path from the root (exclusive) of every real node of one row, by walking parents."""
    tokens, parents = tree.tokens[row].tolist(), tree.parents[row].tolist()
    out = []
    for node in range(1, len(parents)):
        if parents[node] < 0:
            continue
        path, cur = [], node
        while cur != 0:
            path.append(tokens[cur])
            cur = parents[cur]
        out.append(tuple(reversed(path)))
    return out


def prefix_mass(logq: torch.Tensor, prefixes) -> float:
    """Expected acceptance under the factorised draft distribution: sum of prefix probabilities."""
    rows = logq.double().tolist()
    return sum(math.exp(sum(rows[i][t] for i, t in enumerate(p))) for p in prefixes)


@pytest.mark.parametrize("budget", [1, 5, 20, 50, 84])
def test_build_tree_matches_brute_force(budget):
    logq = random_logprobs(1, 3, 4, seed=budget)
    tree = build_tree(logq, budget)
    built = tree_prefixes(tree, 0)
    expected = brute_force_best(logq[0], budget)
    assert len(built) == len(set(built)) == budget
    assert set(built) == set(expected)
    assert prefix_mass(logq[0], built) == pytest.approx(prefix_mass(logq[0], expected), rel=1e-9)


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_build_tree_respects_topk_cap(topk):
    logq = random_logprobs(1, 3, 4, seed=10 + topk)
    budget = 12
    tree = build_tree(logq, budget, topk=topk)
    built = tree_prefixes(tree, 0)
    expected = brute_force_best(logq[0], budget, topk=topk)
    assert set(built) == set(expected)
    top_sets = [set(torch.topk(logq[0, d], topk).indices.tolist()) for d in range(3)]
    assert all(tok in top_sets[i] for p in built for i, tok in enumerate(p))


def test_build_tree_structure_and_logprobs():
    logq = random_logprobs(2, 4, 6, seed=3)
    roots = torch.tensor([11, 22])
    tree = build_tree(logq, 30, root_tokens=roots)
    width = 31
    for name in ("tokens", "parents", "depths", "logprob"):
        assert getattr(tree, name).shape == (2, width)
    assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == torch.int64
    assert tree.logprob.dtype == torch.float32
    assert tree.tokens[:, 0].tolist() == [11, 22]
    assert tree.parents[:, 0].tolist() == [-1, -1]
    for b in range(2):
        parents, depths = tree.parents[b].tolist(), tree.depths[b].tolist()
        tokens, lp = tree.tokens[b].tolist(), tree.logprob[b].tolist()
        assert depths[0] == 0 and lp[0] == 0.0
        for i in range(1, width):
            assert 0 <= parents[i] < i
            assert depths[i] == depths[parents[i]] + 1
            step = logq[b, depths[i] - 1, tokens[i]].item()
            assert lp[i] == pytest.approx(lp[parents[i]] + step, abs=1e-5)
        # Pop order is best-first: cumulative log-probs never increase.
        assert all(lp[i] >= lp[i + 1] - 1e-6 for i in range(1, width - 1))
    assert tree.num_nodes.tolist() == [30, 30]
    assert tree.max_depth == int(tree.depths.max())


@pytest.mark.parametrize("budget", [2, 3, 10])
def test_topk_one_is_argmax_chain(budget):
    logq = random_logprobs(1, 3, 5, seed=budget)
    tree = build_tree(logq, budget, topk=1)
    length = min(budget, 3)
    argmax = logq[0].argmax(dim=-1).tolist()
    assert tree.tokens[0, 1:length + 1].tolist() == argmax[:length]
    assert tree.parents[0, 1:length + 1].tolist() == list(range(length))
    assert tree.depths[0, 1:length + 1].tolist() == list(range(1, length + 1))
    assert tree.parents[0, length + 1:].tolist() == [-2] * (budget - length)
    assert tree.num_nodes.tolist() == [length]
    assert tree.max_depth == length


def test_budget_beyond_all_prefixes_pads():
    logq = random_logprobs(1, 2, 3, seed=5)            # 3 + 9 = 12 prefixes
    tree = build_tree(logq, 20)
    assert tree.num_nodes.tolist() == [12]
    assert set(tree_prefixes(tree, 0)) == set(brute_force_best(logq[0], 12))
    assert tree.parents[0, 13:].tolist() == [-2] * 8
    assert tree.depths[0, 13:].tolist() == [0] * 8
    assert tree.tokens[0, 13:].tolist() == [0] * 8
    assert tree.tokens[0, 0].item() == 0               # no root token given


def test_batch_rows_are_independent():
    logq = random_logprobs(3, 3, 5, seed=7)
    batched = build_tree(logq, 17, topk=4)
    for b in range(3):
        single = build_tree(logq[b:b + 1], 17, topk=4)
        for name in ("tokens", "parents", "depths", "logprob", "num_nodes"):
            assert torch.equal(getattr(batched, name)[b], getattr(single, name)[0]), name


def test_ties_are_deterministic():
    logq = torch.full((1, 3, 4), math.log(0.25))
    first, second = build_tree(logq, 25), build_tree(logq, 25)
    assert torch.equal(first.parents, second.parents) and torch.equal(first.tokens, second.tokens)
    prefixes = tree_prefixes(first, 0)
    assert len(set(prefixes)) == 25
    # Under uniform marginals the best tree holds all 4 + 16 shallower prefixes first.
    assert sum(len(p) <= 2 for p in prefixes) == 20


def test_zero_budget_is_root_only():
    tree = build_tree(random_logprobs(2, 3, 4, seed=1), 0, root_tokens=torch.tensor([3, 4]))
    assert tree.tokens.tolist() == [[3], [4]] and tree.parents.tolist() == [[-1], [-1]]
    assert tree.num_nodes.tolist() == [0, 0] and tree.max_depth == 0


def brute_force_mask(parents: list[int]) -> list[list[bool]]:
    """Ancestor-or-self sets by walking parent pointers one at a time."""
    width = len(parents)
    mask = [[False] * width for _ in range(width)]
    for i in range(width):
        mask[i][i] = True
        if parents[i] == PAD_PARENT:
            continue
        cur = parents[i]
        while cur >= 0:
            mask[i][cur] = True
            cur = parents[cur]
    return mask


def random_parents(num_real: int, width: int, gen: torch.Generator, chain_bias: bool) -> list[int]:
    """A random tree in topological order, padded with PAD_PARENT up to `width`."""
    parents = [ROOT_PARENT]
    for i in range(1, num_real + 1):
        if chain_bias and torch.rand(1, generator=gen).item() < 0.8:
            parents.append(i - 1)                      # long paths exercise many doubling steps
        else:
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
    return parents + [PAD_PARENT] * (width - 1 - num_real)


@pytest.mark.parametrize("width", [1, 2, 7, 40])
def test_tree_attention_mask_matches_ancestor_walk(width):
    gen = torch.Generator().manual_seed(width)
    rows = [random_parents(int(torch.randint(0, width, (1,), generator=gen)), width, gen, b % 2 == 0)
            for b in range(6)]
    rows[0] = random_parents(width - 1, width, gen, chain_bias=True)   # one full row
    mask = tree_attention_mask(torch.tensor(rows))
    assert mask.shape == (6, width, width) and mask.dtype == torch.bool
    for b, parents in enumerate(rows):
        assert mask[b].tolist() == brute_force_mask(parents), b


def test_full_chain_mask_is_lower_triangular():
    tree = chain_tree(torch.arange(1, 33)[None], torch.tensor([0]))
    assert torch.equal(tree_attention_mask(tree.parents)[0], torch.ones(33, 33, dtype=torch.bool).tril())


def test_tree_positions():
    depths = torch.tensor([[0, 1, 1, 2, 0], [0, 1, 2, 3, 4]])
    positions = tree_positions(depths, torch.tensor([10, 3]))
    assert positions.tolist() == [[10, 11, 11, 12, 10], [3, 4, 5, 6, 7]]


def test_chain_tree_with_padding():
    drafts = torch.tensor([[5, 6, 7], [8, 9, 10]])
    tree = chain_tree(drafts, torch.tensor([1, 2]), num_drafts=torch.tensor([3, 1]))
    assert tree.tokens.tolist() == [[1, 5, 6, 7], [2, 8, 0, 0]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2], [-1, 0, -2, -2]]
    assert tree.depths.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    assert tree.num_nodes.tolist() == [3, 1]
    assert tree.max_depth == 3
    assert tree_attention_mask(tree.parents)[1].tolist() == brute_force_mask([-1, 0, -2, -2])


def test_accepted_kv_indices_compacts_the_accepted_path():
    # Verify-written K/V entries carry their node index; compaction must leave, at offsets
    # 0..accept_len, the root followed by the accepted nodes found by walking the tree.
    parents = [-1, 0, 0, 1, 2, 3, 3, -2]
    accepted_leaf = {0: 5, 1: 4, 2: 0}
    paths, lens, expected = [], [], []
    for leaf in accepted_leaf.values():
        walk, cur = [], leaf
        while cur >= 0:
            walk.append(cur)
            cur = parents[cur]
        walk.reverse()
        expected.append(walk)
        lens.append(len(walk) - 1)
        paths.append(walk + [-1] * (4 - len(walk)))
    src, keep = accepted_kv_indices(torch.tensor(paths), torch.tensor(lens))
    assert keep.sum(dim=1).tolist() == [n + 1 for n in lens]
    cache = torch.arange(len(parents)) * 100                 # K/V stand-in: 100 · node index
    for b in range(3):
        compacted = cache.clone()
        dst = torch.arange(src.shape[1])[keep[b]]
        compacted[dst] = cache[src[b][keep[b]]]
        assert compacted[:lens[b] + 1].tolist() == [100 * n for n in expected[b]]
    assert (src[~keep] == 0).all()


def test_build_tree_timing_print():
    logq = torch.log_softmax(torch.randn(4, 15, 8192, generator=torch.Generator().manual_seed(0)), -1)
    build_tree(logq, 256)                                    # warm-up
    runs = 5
    start = time.perf_counter()
    for _ in range(runs):
        tree = build_tree(logq, 256)
    elapsed_ms = (time.perf_counter() - start) / runs * 1e3
    print(f"\nbuild_tree B=4 L=15 V=8192 budget=256: {elapsed_ms:.2f} ms")
    assert tree.num_nodes.tolist() == [256] * 4


def test_build_tree_knows_whether_every_row_is_a_chain():
    confident = torch.full((1, 4, 6), -20.0)
    confident[..., 0] = 0.0                                 # one sure token per depth: a chain
    mixed = torch.cat([confident, torch.log_softmax(torch.zeros(1, 4, 6), -1)])   # + a flat row: branches
    assert build_tree(confident, 4).is_chain
    tree = build_tree(mixed, 4)
    assert not tree.is_chain and tree.max_depth == 4        # the chain row reaches width − 1


def test_with_rows_mixes_rows_of_two_trees():
    """Rows where the mask is True come from the other tree, whole; the depth bound covers both;
    trees of another width are refused."""
    logp = torch.log_softmax(torch.arange(2 * 3 * 6, dtype=torch.float32).reshape(2, 3, 6).sin() * 3, -1)
    bushy = build_tree(logp, 3, None, torch.tensor([1, 2]))
    chain = chain_tree(torch.tensor([[4, 5, 0], [1, 2, 3]]), torch.tensor([1, 2]))
    mixed = with_rows(bushy, chain, torch.tensor([False, True]))
    for field in ("tokens", "parents", "depths", "num_nodes", "logprob"):
        assert torch.equal(getattr(mixed, field)[0], getattr(bushy, field)[0])
        assert torch.equal(getattr(mixed, field)[1], getattr(chain, field)[1])
    assert mixed.max_depth == 3 and not mixed.is_chain
    with pytest.raises(ValueError, match="cannot mix rows"):
        with_rows(bushy, chain_tree(torch.zeros(2, 2, dtype=torch.long), torch.tensor([1, 2])), torch.tensor([True, True]))
