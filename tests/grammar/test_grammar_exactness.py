"""Speculative sampling under a grammar is distributed exactly as the masked target p′.

The 12-token fixture's first NUM_TOKENS tokens are enumerated under the grammar's mask (each
prefix's logits from transformers, masked by a fresh matcher fed the prefix), and seeded
requests must fit that law. The drafts are DFlash chains sampled from the drafter's q and
verified by rejection sampling, the case where cutting drafts is delicate: the negative
control cuts a forbidden draft instead of letting verification reject it (so the next token
comes from p′ instead of the residual (p′ − q)⁺), and must fail the same test.
"""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr
from transformers import AutoModelForCausalLM

import blockspec.grammar.processor as processor_module
from blockspec.grammar.mask import unpack_bitmask
from blockspec.grammar.matcher import ALL_ALLOWED, GrammarCompiler
from blockspec.structured_output import StructuredOutput
from blockspec.sampling import SamplingParams
from blockspec.tokenizer import Tokenizer
from blockspec.validation.lossless import chi_square_against_law, exact_joint_law
from dflash_fixtures import write_dflash_drafter
from test_lossless import ALPHA, PROMPT, exact_law_llm

NUM_TOKENS = 2
NUM_SAMPLES = 4_000
# Words of the fixture's vocabulary; no output of 2 tokens completes it, so no stop token is
# allowed within the law's horizon.
GRAMMAR = StructuredOutput("regex", "(the|a|and)(of|to|in|the)(is|a)+")
PARAMS = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("grammar_law_drafter"), tiny_vocab_dir,
                                    block_size=8, std=0.3))


@pytest.fixture(scope="module")
def masked_law(tiny_vocab_dir):
    hf = AutoModelForCausalLM.from_pretrained(tiny_vocab_dir, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    compiler = GrammarCompiler(Tokenizer.load(tiny_vocab_dir), vocab)
    compiled = compiler.compile(GRAMMAR)

    def masked_logits(seqs):
        with torch.no_grad():
            logits = hf(torch.tensor(seqs)).logits[:, -1]
        bitmask = torch.full((len(seqs), compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
        for i, seq in enumerate(seqs):
            matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=[8])
            assert all(matcher.accept_token(t) for t in seq[len(PROMPT):])
            matcher.fill_next_token_bitmask(bitmask, i)
        return logits.masked_fill(~unpack_bitmask(bitmask, vocab), float("-inf"))
    return exact_joint_law(masked_logits, PROMPT, PARAMS, vocab, NUM_TOKENS)


def grammar_fit(llm, law):
    # Unseeded: the verifiers decide every token (seeded rows take the exponential race).
    plist = [SamplingParams(temperature=PARAMS.temperature, max_tokens=NUM_TOKENS, structured_output=GRAMMAR)
             for i in range(NUM_SAMPLES)]
    samples = [tuple(o.token_ids[:NUM_TOKENS]) for o in llm.generate([PROMPT] * NUM_SAMPLES, plist)]
    return chi_square_against_law(samples, law)


def rejection_llm(tiny_vocab_dir, drafter):
    return exact_law_llm(tiny_vocab_dir, 24, spec="dflash", draft_model=drafter, block_size=4,
                         spec_verify="rejection")


def test_rejection_sampled_chains_fit_the_masked_law(tiny_vocab_dir, drafter, masked_law):
    assert len(masked_law) > 4  # the grammar leaves several outcomes: the test has power
    llm = rejection_llm(tiny_vocab_dir, drafter)
    result = grammar_fit(llm, masked_law)
    assert result.p_value > ALPHA, f"chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def test_negative_control_cutting_sampled_forbidden_drafts_fails(tiny_vocab_dir, drafter, masked_law, monkeypatch):
    keep = processor_module.nodes_to_keep
    monkeypatch.setattr(processor_module, "nodes_to_keep",
                        lambda allowed, parents, sampled_drafts: keep(allowed, parents, False))
    result = grammar_fit(rejection_llm(tiny_vocab_dir, drafter), masked_law)
    assert result.p_value < ALPHA, f"cutting sampled forbidden drafts passed: p={result.p_value:.3f}"
