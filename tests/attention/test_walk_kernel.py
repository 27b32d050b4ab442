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


def test_step_checks_the_kernels_and_says_when_it_cannot_use_one(monkeypatch, caplog):
    """A CUDA engine's step adopts each verify kernel after checking it against its reference;
    a kernel that fails (here: one that raises, then one that verifies wrong) leaves that
    reference in use, the other kernel still adopted, and the log says so."""
    import logging

    import blockspec.speculative.walk_kernel as walk_kernel
    from blockspec.speculative.step import SpeculativeStep
    from blockspec.speculative.verify import verify_sampled_tree

    step = SpeculativeStep(None)
    assert (step.greedy_walk, step.sampled_tree_verify) == (verify_tree_greedy, verify_sampled_tree)  # no device given
    step.use_verify_kernels(torch.device(DEVICE), sampled_trees=False)     # a step without sampled trees
    assert step.greedy_walk is walk_kernel.verify_tree_greedy_triton and step.sampled_tree_verify is verify_sampled_tree
    step.use_verify_kernels(torch.device(DEVICE))
    assert step.greedy_walk is walk_kernel.verify_tree_greedy_triton
    assert step.sampled_tree_verify is walk_kernel.verify_sampled_tree_triton

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    def wrong(reference):
        def verify(*args):
            result = reference(*args)
            result.accept_len = result.accept_len + 1
            return result
        return verify

    for name, kernel_name, reference in (("greedy_walk", "verify_tree_greedy_triton", verify_tree_greedy),
                                         ("sampled_tree_verify", "verify_sampled_tree_triton", verify_sampled_tree)):
        for bad in (broken, wrong(reference)):
            monkeypatch.setattr(walk_kernel, kernel_name, bad)
            step = SpeculativeStep(None)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="blockspec.speculative"):
                step.use_verify_kernels(torch.device(DEVICE))
            assert getattr(step, name) is reference
            assert f"the {name} kernel is unusable" in caplog.text
            other = "sampled_tree_verify" if name == "greedy_walk" else "greedy_walk"
            assert getattr(step, other).__module__ == walk_kernel.__name__
        monkeypatch.undo()


def sampled_tree_case(seed: int, B: int, V: int, parents: list[int], depths: list[int], top_k: int):
    """Rows of one tree shape with children drawn from q without replacement (padding where q
    ran out), p and q random with `top_k` positive tokens each, and the uniforms."""
    from blockspec.speculative.sampled_tree import fill_with_samples
    from blockspec.speculative.tree import DraftTree
    gen = torch.Generator().manual_seed(seed)
    W, L = len(parents), max(depths)

    def laws(*shape):
        x = torch.randn(*shape, V, generator=gen) * 2
        cut = x.topk(top_k, dim=-1).values[..., -1:]
        return torch.softmax(x.masked_fill(x < cut, float("-inf")), -1)

    p, q = laws(B, W), laws(B, L)
    tree = DraftTree(torch.zeros(B, W, dtype=torch.long), torch.tensor([parents]).expand(B, -1).contiguous(),
                     torch.tensor([depths]).expand(B, -1).contiguous(), torch.full((B,), W - 1),
                     torch.zeros(B, W), L)
    tree = fill_with_samples(tree, q, torch.rand(B, W - 1, generator=gen, dtype=torch.float64),
                             torch.ones(B, dtype=torch.bool))
    accept = torch.rand(B, W - 1, generator=gen, dtype=torch.float64)
    bonus = torch.rand(B, generator=gen, dtype=torch.float64)
    return p, q, tree, accept, bonus


@pytest.mark.parametrize("V, top_k", [(7, 3), (13, 13), (3000, 40)])
def test_sampled_tree_kernel_equals_reference(V, top_k):
    """Several siblings a node (rejections, renormalised q, residuals), undrawable padding, and a
    vocabulary wider than one tile of the kernel's loop."""
    from blockspec.speculative.verify import verify_sampled_tree
    from blockspec.speculative.walk_kernel import verify_sampled_tree_triton
    parents, depths = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7], [0, 1, 1, 1, 2, 2, 2, 3, 3, 4]
    p, q, tree, accept, bonus = sampled_tree_case(V, 64 if V < 100 else 8, V, parents, depths, top_k)
    want = verify_sampled_tree(p, q, tree.tokens, tree.parents, accept, bonus, 4)
    got = verify_sampled_tree_triton(p.to(DEVICE), q.to(DEVICE), tree.tokens.to(DEVICE), tree.parents.to(DEVICE),
                                     accept.to(DEVICE), bonus.to(DEVICE), 4)
    for field in ("accept_len", "path", "committed"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
    if V < 100:   # the cases reach younger siblings and deep nodes
        assert int((want.path[:, 1] >= 2).sum()) > 3 and int(want.accept_len.max()) >= 3


def test_sampled_tree_kernel_reads_strided_uniforms():
    """The step passes the accept uniforms as a column slice of its uniforms."""
    from blockspec.speculative.verify import verify_sampled_tree
    from blockspec.speculative.walk_kernel import verify_sampled_tree_triton
    p, q, tree, accept, bonus = sampled_tree_case(3, 16, 9, [-1, 0, 0, 1, 1], [0, 1, 1, 2, 2], 5)
    wide = torch.cat([torch.rand(16, 4, dtype=torch.float64), accept, bonus[:, None]], dim=1)
    want = verify_sampled_tree(p, q, tree.tokens, tree.parents, accept, bonus, 2)
    wide = wide.to(DEVICE)
    got = verify_sampled_tree_triton(p.to(DEVICE), q.to(DEVICE), tree.tokens.to(DEVICE), tree.parents.to(DEVICE),
                                     wide[:, 4:8], wide[:, 8], 2)
    assert torch.equal(got.committed.cpu(), want.committed) and torch.equal(got.path.cpu(), want.path)
