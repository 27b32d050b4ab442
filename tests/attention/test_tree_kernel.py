"""DDTree's best-first search as a Triton kernel (interpreter on CPU) builds exactly the host
heap's tree: nodes, order, depths, tokens and log-probabilities, with ties and -inf scores."""

from __future__ import annotations

import pytest
import torch

from blockspec.speculative.tree import build_tree
from blockspec.speculative.tree_kernel import build_tree_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("tokens", "parents", "depths", "num_nodes", "logprob")


def cases(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for trial in range(n):
        B, L, V = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 4), (1, 6), (2, 12)))
        budget, topk = int(torch.randint(0, 30, (1,), generator=gen)), [None, 1, 2, 3][trial % 4]
        x = torch.randn(B, L, V, generator=gen)
        if trial % 3 == 0:
            x = (x * 2).round() / 2                                 # many tied scores
        logprobs = torch.log_softmax(x, -1)
        if trial % 5 == 0:
            logprobs[..., 0] = float("-inf")
        yield logprobs, budget, topk, torch.randint(0, V, (B,), generator=gen)


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_tree_equals_host_heap(seed):
    for logprobs, budget, topk, roots in cases(12, seed):
        # The host heap from the same device's top-k: torch.topk orders tied values differently
        # on CPU and CUDA (seen on an H200), and both searches start from its result.
        want = build_tree(logprobs.to(DEVICE), budget, topk, roots.to(DEVICE)).to("cpu")
        got = build_tree_triton(logprobs.to(DEVICE), budget, topk, roots.to(DEVICE))
        for field in FIELDS:
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), (field, budget, topk)


def test_kernel_tree_at_drafter_shape():
    """Block 16 (15 depths), a real-size vocabulary slice, budgets 16 and 64."""
    logprobs = torch.log_softmax(torch.randn(2, 15, 500, generator=torch.Generator().manual_seed(3)) * 3, -1)
    for budget in (16, 64):
        want = build_tree(logprobs, budget)
        got = build_tree_triton(logprobs.to(DEVICE), budget)
        assert want.num_nodes.tolist() == [budget, budget]
        for field in FIELDS:
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field


def test_ties_go_to_the_earliest_push():
    """Uniform scores (every tie decided by push order), worked by hand: the four depth-1 nodes,
    then node 1's child (pushed before the others' children), then node 2's. A latest-first or
    any other tie rule gives another tree."""
    logprobs = torch.log_softmax(torch.zeros(1, 2, 4), -1)
    for tree in (build_tree(logprobs, 6), build_tree_triton(logprobs.to(DEVICE), 6)):
        assert tree.parents.tolist() == [[-1, 0, 0, 0, 0, 1, 2]]
        assert tree.depths.tolist() == [[0, 1, 1, 1, 1, 2, 2]]


def test_proposer_checks_the_kernel_and_says_when_it_cannot_use_it(monkeypatch, caplog):
    """On CUDA a DDTree proposer adopts the kernel after checking it against the heap; a kernel
    that fails (here: one that raises) leaves trees on the host, and the log says so."""
    import logging

    import blockspec.speculative.tree_kernel as tree_kernel
    from blockspec.speculative.proposers import DFlashProposer

    proposer = DFlashProposer.__new__(DFlashProposer)
    proposer.sample_drafts = False                      # (target-only: no children kernel to check)
    proposer.drafts_on_device, proposer.build_tree = True, build_tree
    proposer._use_tree_kernel(torch.device(DEVICE))
    assert proposer.build_tree is build_tree_triton and proposer.drafts_on_device

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(tree_kernel, "build_tree_triton", broken)
    proposer.drafts_on_device, proposer.build_tree = True, build_tree
    with caplog.at_level(logging.WARNING, logger="blockspec.proposers"):
        proposer._use_tree_kernel(torch.device(DEVICE))
    assert proposer.build_tree is build_tree and not proposer.drafts_on_device
    assert "built on the host" in caplog.text


def test_nan_and_infinite_scores_rank_last():
    """A NaN depth (the log-softmax of an infinite race score once made one) or a +inf score
    ranks as −inf in both searches: the trees are equal, every token is one of the vocabulary's
    and no log-probability is NaN. (The kernel used to pop nothing on a NaN depth and read the
    node's token from outside its row: a crashed GPU server.)"""
    V = 9
    logprobs = torch.log_softmax(torch.randn(3, 4, V, generator=torch.Generator().manual_seed(4)), -1)
    logprobs[0, 0] = float("nan")                 # the whole first depth
    logprobs[1, 2, 3] = float("inf")
    logprobs[2, 1, :4] = float("nan")
    for budget in (5, 12):
        # (From the same device's top-k: CPU and CUDA order the tied −inf scores differently.)
        want = build_tree(logprobs.to(DEVICE), budget).to("cpu")
        got = build_tree_triton(logprobs.to(DEVICE), budget)
        for field in FIELDS:
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), (field, budget)
        assert want.num_nodes.tolist() == [budget] * 3
        assert ((want.tokens >= 0) & (want.tokens < V)).all() and not want.logprob.isnan().any()
        assert want.logprob[1].isfinite().all() and want.logprob[0, 1:].eq(float("-inf")).all()
