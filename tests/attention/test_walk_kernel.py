"""The greedy tree walk as a Triton kernel (interpreter on CPU) commits exactly what the
reference walk does: accept counts, paths and committed tokens, on DDTree trees, chains with
padding and hand-made trees, with targets that follow the tree for a while and then leave it."""

from __future__ import annotations

import pytest
import torch

from blockspec.speculative.tree import build_tree, chain_tree
from blockspec.speculative.verify import verify_tree_greedy
from blockspec.speculative.walk_kernel import verify_tree_greedy_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def targets_along(tree, gen, follow: float) -> torch.Tensor:
    """`[B, N+1]` the target's token after each node: with probability `follow` the token of one
    of the node's children (so the walk goes on), else a random token."""
    B, W = tree.tokens.shape
    out = torch.randint(0, 12, (B, W), generator=gen)
    for b in range(B):
        for i in range(W):
            kids = [j for j in range(W) if int(tree.parents[b, j]) == i]
            if kids and float(torch.rand(1, generator=gen)) < follow:
                out[b, i] = tree.tokens[b, kids[int(torch.randint(len(kids), (1,), generator=gen))]]
    return out


def assert_walks_equal(tree, targets):
    want = verify_tree_greedy(targets, tree.tokens, tree.parents, tree.max_depth, tree.is_chain)
    got = verify_tree_greedy_triton(targets.to(DEVICE), tree.tokens.to(DEVICE), tree.parents.to(DEVICE),
                                    tree.max_depth)
    for field in ("accept_len", "path", "committed"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
    return want


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_walk_equals_reference_on_ddtree_trees(seed):
    gen = torch.Generator().manual_seed(seed)
    accepted = []
    for trial in range(8):
        B, L, V = 3, int(torch.randint(1, 8, (1,), generator=gen)), 12
        budget = int(torch.randint(1, 40, (1,), generator=gen))
        logprobs = torch.log_softmax(torch.randn(B, L, V, generator=gen) * 2, -1)
        tree = build_tree(logprobs, budget, None, torch.randint(0, V, (B,), generator=gen))
        want = assert_walks_equal(tree, targets_along(tree, gen, follow=[0.0, 0.7, 1.0][trial % 3]))
        accepted += want.accept_len.tolist()
    assert max(accepted) >= 3 and min(accepted) == 0      # the cases walk deep and stop at once


def test_kernel_walk_equals_reference_on_padded_chains():
    gen = torch.Generator().manual_seed(5)
    drafts = torch.randint(0, 12, (4, 7), generator=gen)
    tree = chain_tree(drafts, torch.randint(0, 12, (4,), generator=gen), torch.tensor([7, 3, 0, 5]))
    targets = torch.cat([drafts, torch.zeros(4, 1, dtype=torch.long)], dim=1)   # every draft matches …
    want = assert_walks_equal(tree, targets)
    assert want.accept_len.tolist() == [7, 3, 0, 5]                          # … up to its padding
    targets[0, 4] = 99
    assert assert_walks_equal(tree, targets).accept_len.tolist()[0] == 4


def test_first_matching_child_in_index_order_wins():
    """Two children of the root carry the same token: the walk takes the earlier (node 1), whose
    own child matches next, not node 2's."""
    tokens = torch.tensor([[7, 3, 3, 5, 6]])
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    targets = torch.tensor([[3, 5, 6, 1, 1]])
    tree = type("T", (), {"tokens": tokens, "parents": parents, "max_depth": 2, "is_chain": False})
    want = assert_walks_equal(tree, targets)
    assert want.path.tolist() == [[0, 1, 3]] and want.committed.tolist() == [[3, 5, 1]]


def test_step_checks_the_kernel_and_says_when_it_cannot_use_it(monkeypatch, caplog):
    """A CUDA engine's step adopts the walk kernel after checking it against the reference; a
    kernel that fails (here: one that raises, then one that walks wrong) leaves the reference
    walk, and the log says so."""
    import logging

    import blockspec.speculative.walk_kernel as walk_kernel
    from blockspec.speculative.step import SpeculativeStep

    step = SpeculativeStep(None)
    assert step.greedy_walk is verify_tree_greedy            # no device given: the reference
    step.use_walk_kernel(torch.device(DEVICE))
    assert step.greedy_walk is walk_kernel.verify_tree_greedy_triton

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    def wrong(targets, tokens, parents, max_depth, is_chain=False):
        result = verify_tree_greedy(targets, tokens, parents, max_depth)
        result.accept_len = result.accept_len + 1
        return result

    for bad in (broken, wrong):
        monkeypatch.setattr(walk_kernel, "verify_tree_greedy_triton", bad)
        step = SpeculativeStep(None)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="blockspec.speculative"):
            step.use_walk_kernel(torch.device(DEVICE))
        assert step.greedy_walk is verify_tree_greedy
        assert "walked by the reference" in caplog.text
