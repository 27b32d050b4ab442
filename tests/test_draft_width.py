"""A proposer asked for a narrower verify width drafts only the depths it can use, and its tree
is the full tree cut to that width (`truncate_tree`; log-probabilities and q to the rounding of a
head over fewer rows): chains and DDTree trees, all-greedy batches and batches mixing greedy,
sampled (drafts and children drawn from q) and seeded (the race) rows. With `draft_block`
"width" (the CPU's default) it drafts a block of that width instead: what a proposer of that
block size drafts."""

from __future__ import annotations

import pytest
import torch

from blockspec.batch import decode_inputs
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams
from blockspec.speculative.tree import truncate_tree
from dflash_fixtures import write_dflash_drafter

FIELDS = ("tokens", "parents", "depths", "num_nodes")   # (log-probabilities: to the head's rounding)


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("width_drafter"), qwen3_dir, block_size=8))


def engine_and_inputs(qwen3_dir, drafter, spec, budget, greedy_only, draft_block):
    """An engine after a prefill and a decode step (the drafter has context), its running
    sequences with a step's lookahead reserved, and their decode inputs."""
    engine = Engine(EngineConfig(model=qwen3_dir, spec=spec, draft_model=drafter, tree_budget=budget,
                                 spec_verify="rejection", spec_policy="static", draft_block=draft_block))
    gen = torch.Generator().manual_seed(3)
    params = [SamplingParams(temperature=0.0, max_tokens=30), SamplingParams(temperature=0.9, max_tokens=30),
              SamplingParams(temperature=0.7, top_p=0.9, max_tokens=30, seed=11), SamplingParams(temperature=1.2, max_tokens=30)]
    if greedy_only:
        params = [SamplingParams(temperature=0.0, max_tokens=30)] * 3
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", torch.randint(0, 500, (5 + 3 * i,), generator=gen).tolist(), p)
    for _ in range(3):
        engine.step()                      # prefills, then a decode step: the drafter has context
    seqs = list(engine.scheduler.running)
    for seq in seqs:
        seq.page_table.reserve(engine.allocator, seq.num_cached + engine.lookahead)
    uniforms = torch.rand(len(seqs), engine.spec_step.uniforms_per_row, generator=gen, dtype=torch.float64)
    inputs = decode_inputs(seqs, uniforms, engine.cache.page_size, engine.device)
    assert inputs.all_greedy == greedy_only
    return engine, seqs, inputs, gen


@pytest.mark.parametrize("greedy_only", [False, True])
@pytest.mark.parametrize("spec, budget", [("dflash", None), ("ddtree", 12)])
def test_a_narrow_width_drafts_the_full_tree_cut_to_it(qwen3_dir, drafter, spec, budget, greedy_only):
    engine, seqs, inputs, gen = engine_and_inputs(qwen3_dir, drafter, spec, budget, greedy_only, "full")
    proposer = engine.proposer
    full, full_q = proposer.propose(seqs, inputs)
    heads = []
    original = proposer.target.logits
    proposer.target.logits = lambda h: heads.append(h.shape[1]) or original(h)
    widths = (2, 3, 5, full.width - 1)
    for width in widths:
        narrow, q = proposer.propose(seqs, inputs, width)
        want = truncate_tree(full, width)
        assert narrow.width == width
        for field in FIELDS:
            assert torch.equal(getattr(narrow, field), getattr(want, field)), (width, field)
        torch.testing.assert_close(narrow.logprob, want.logprob)
        if full_q is not None:
            assert q.shape[1] == min(width - 1, proposer.max_depth)
            torch.testing.assert_close(q, full_q[:, :q.shape[1]])
    proposer.target.logits = original
    assert heads == [min(w - 1, proposer.max_depth) for w in widths]     # the head ran on the depths used only


@pytest.mark.parametrize("greedy_only", [False, True])
def test_with_width_blocks_a_narrow_width_drafts_what_a_proposer_of_that_block_drafts(qwen3_dir, drafter, greedy_only):
    """`draft_block` "width": a step at width w drafts from a block of w positions, as a proposer
    of block size w (a static engine of that block) does, not the whole block's first drafts."""
    engine, seqs, inputs, _ = engine_and_inputs(qwen3_dir, drafter, "dflash", None, greedy_only, "width")
    proposer = engine.proposer
    assert proposer.width_blocks
    full, _ = proposer.propose(seqs, inputs)
    differs = False
    for width in (2, 3, 5):
        narrow, q = proposer.propose(seqs, inputs, width)
        proposer.width_blocks, proposer.block_size, proposer.max_depth = False, width, width - 1
        own, own_q = proposer.propose(seqs, inputs)          # a block-`width` proposer's whole block
        proposer.width_blocks, proposer.block_size, proposer.max_depth = True, 8, 7
        for field in FIELDS:
            assert torch.equal(getattr(narrow, field), getattr(own, field)), (width, field)
        if q is not None:
            torch.testing.assert_close(q, own_q)
        differs |= not torch.equal(narrow.tokens, truncate_tree(full, width).tokens)
    assert differs          # (the drafts do depend on the block: this is not the full block cut)
    assert not Engine(EngineConfig(model=qwen3_dir, spec="dflash", draft_model=drafter,
                                   draft_block="full")).proposer.width_blocks
