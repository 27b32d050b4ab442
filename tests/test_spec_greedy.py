"""Greedy speculative decoding is token-identical to plain greedy decoding."""

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.speculative.proposers import Proposer
from blockspec.speculative.tree import chain_tree
from dflash_fixtures import write_dflash_drafter

GREEDY = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)


class OracleProposer(Proposer):
    """Proposes the target's own greedy continuation: every draft must be accepted."""


    def __init__(self, continuations: dict[tuple, list[int]], num_draft: int):
        self.continuations = continuations
        self.max_depth = self.max_nodes = num_draft


    def propose(self, seqs, inputs, width=None):
        roots = inputs.roots
        rows, counts = [], []
        for s in seqs:
            cont = self.continuations[tuple(s.prompt_ids)]
            nxt = cont[s.num_output:s.num_output + self.max_nodes]
            counts.append(len(nxt))
            rows.append(nxt + [0] * (self.max_nodes - len(nxt)))
        return chain_tree(torch.tensor(rows), roots, torch.tensor(counts)), None


def prompts_for(vocab, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 1, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def plain_outputs(request):
    cache = {}

    def get(model_dir, prompts):
        key = (model_dir, tuple(map(tuple, prompts)))
        if key not in cache:
            cache[key] = [o.token_ids for o in LLM(model=model_dir).generate(prompts, GREEDY)]
        return cache[key]
    return get


@pytest.mark.parametrize("family", ["qwen3_dir", "llama_dir"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_dflash_greedy_equals_plain(family, block_size, request, tmp_path, plain_outputs):
    model_dir = request.getfixturevalue(family)
    drafter = write_dflash_drafter(tmp_path / "drafter", model_dir, block_size=8)
    prompts = prompts_for(512, [7, 19, 3, 30])
    expected = plain_outputs(model_dir, prompts)
    llm = LLM(model=model_dir, spec="dflash", draft_model=str(drafter), block_size=block_size)
    alone = llm.generate(prompts[0], GREEDY)[0]
    assert alone.token_ids == expected[0]
    batch = llm.generate(prompts, GREEDY)
    for out, exp in zip(batch, expected):
        assert out.token_ids == exp
        assert out.metrics.verify_steps > 0
    assert llm.engine.allocator.num_used_pages == 0


def test_ngram_greedy_equals_plain(qwen3_dir, plain_outputs):
    prompts = prompts_for(512, [12, 5, 25], seed=3)
    prompts[0] = prompts[0] * 3  # repetitive prompt so that lookups hit
    expected = plain_outputs(qwen3_dir, prompts)
    llm = LLM(model=qwen3_dir, spec="ngram", block_size=5)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.drafted_tokens for o in outs) > 0


@pytest.mark.parametrize("num_draft", [3, 7])
def test_oracle_reaches_maximum_accept_length(qwen3_dir, plain_outputs, num_draft):
    prompts = prompts_for(512, [6, 14], seed=5)
    expected = plain_outputs(qwen3_dir, prompts)
    oracle = OracleProposer({tuple(p): e for p, e in zip(prompts, expected)}, num_draft)
    # Static: the full block every step (the adaptive policy would time narrower widths first).
    engine = Engine(EngineConfig(model=qwen3_dir, spec="dflash", spec_policy="static"), proposer=oracle)
    llm = LLM.from_engine(engine)
    outs = llm.generate(prompts, GREEDY)
    for out, exp in zip(outs, expected):
        assert out.token_ids == exp
        # every verify step commits num_draft + 1 tokens except possibly the last
        steps = out.metrics.verify_steps
        assert steps == -(-(128 - 1) // (num_draft + 1))
        assert out.metrics.accepted_tokens == out.metrics.drafted_tokens
