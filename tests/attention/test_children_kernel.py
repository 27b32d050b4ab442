"""A sampled tree's children drawn by the Triton kernel (interpreter on CPU) are exactly the
reference's draws (`sampled_tree.sample_children`, whose law tests/test_sampled_tree.py checks):
siblings without replacement, q with zeros (support smaller than the children), undrawable
nodes, padding, and a vocabulary wider than the binary search's first guesses."""

from __future__ import annotations

import pytest
import torch

from blockspec.speculative.children_kernel import sample_children_triton
from blockspec.speculative.sampled_tree import sample_children
from blockspec.speculative.tree import build_tree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_draws_equal(parents, depths, q, uniforms):
    want = sample_children(parents, depths, q, uniforms)
    got = sample_children_triton(parents.to(DEVICE), depths.to(DEVICE), q.to(DEVICE), uniforms.to(DEVICE))
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    return want


@pytest.mark.parametrize("seed, V, top_k", [(0, 6, 2), (1, 11, 11), (2, 40, 5), (3, 3000, 30)])
def test_kernel_draws_equal_the_reference(seed, V, top_k):
    gen = torch.Generator().manual_seed(seed)
    B, L = 6, 4
    x = torch.randn(B, L, V, generator=gen) * 2
    cut = x.topk(top_k, dim=-1).values[..., -1:]
    q = torch.softmax(x.masked_fill(x < cut, float("-inf")), -1)
    shape = build_tree(torch.log_softmax(torch.randn(B, L, V, generator=gen), -1), 14, None)
    parents = shape.parents.clone()
    parents[0, -3:] = -2                                       # padding inside a row
    uniforms = torch.rand(B, shape.width - 1, generator=gen, dtype=torch.float64)
    uniforms[1, :3] = torch.tensor([0.0, 1.0 - 1e-12, 0.5])  # the ends of the interval
    tokens, drawn = assert_draws_equal(parents, shape.depths, q, uniforms)
    siblings = (parents[:, :, None] == parents[:, None, :]) & (parents[:, :, None] >= 0)
    assert (siblings.sum(-1) > 1).any()                       # several children a parent are drawn
    if top_k < 5:
        assert not drawn[parents >= 0].all()                  # q's support ran out for some


def test_kernel_draws_strided_uniforms_and_hand_worked_case():
    """Root children drawn from q = (0.5, 0.3, 0.2): u = 0.6 → token 1 (cdf 0.5 ≤ 0.6 < 0.8);
    the second child, token 1 removed, u = 0.9 of the rest (0.7) = 0.63 → after removing
    0.3 below token 2 the crossing is token 2 (0.5 ≤ 0.63, 1.0 − 0.3 = 0.7 > 0.63)."""
    q = torch.tensor([[[0.5, 0.3, 0.2]]])
    parents, depths = torch.tensor([[-1, 0, 0]]), torch.tensor([[0, 1, 1]])
    wide = torch.tensor([[0.1, 0.6, 0.9, 0.2]], dtype=torch.float64)
    tokens, drawn = assert_draws_equal(parents, depths, q, wide[:, 1:3])
    wide = wide.to(DEVICE)
    got = sample_children_triton(parents.to(DEVICE), depths.to(DEVICE), q.to(DEVICE), wide[:, 1:3])
    assert tokens.tolist() == [[0, 1, 2]] and got[0].tolist() == [[0, 1, 2]] and drawn.all()


def test_proposer_checks_the_children_kernel_and_says_when_it_cannot_use_it(monkeypatch, caplog):
    import logging

    import blockspec.speculative.children_kernel as children_kernel
    from blockspec.speculative.proposers import DFlashProposer
    from blockspec.speculative.tree_kernel import build_tree_triton

    proposer = DFlashProposer.__new__(DFlashProposer)
    proposer.drafts_on_device, proposer.build_tree, proposer.sample_children = True, build_tree, sample_children
    proposer.sample_drafts = False                       # target-only trees draw nothing: not checked
    proposer._use_tree_kernel(torch.device(DEVICE))
    assert proposer.sample_children is sample_children and proposer.build_tree is build_tree_triton
    proposer.sample_drafts = True
    proposer._use_tree_kernel(torch.device(DEVICE))
    assert proposer.sample_children is sample_children_triton and proposer.build_tree is build_tree_triton

    def wrong(parents, depths, q, uniforms):
        tokens, drawn = sample_children(parents, depths, q, uniforms)
        return tokens.flip(1), drawn

    monkeypatch.setattr(children_kernel, "sample_children_triton", wrong)
    proposer.sample_children = sample_children
    with caplog.at_level(logging.WARNING, logger="blockspec.proposers"):
        proposer._use_tree_kernel(torch.device(DEVICE))
    assert proposer.sample_children is sample_children and proposer.build_tree is build_tree_triton
    assert "children kernel is unusable" in caplog.text
