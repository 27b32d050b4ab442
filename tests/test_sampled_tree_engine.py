"""DDTree with `spec_verify="rejection"` through the engine: sampled trees are lossless (the
exact joint law of the first tokens, tests/test_lossless.py style, batched: 20,000 seeded
requests at once) at several budgets and filter mixes, a wrong residual rule fails the same
test, greedy rows (alone or beside sampled ones) equal plain greedy decoding, and a sampled
row without q is refused."""

import pytest
import torch

import blockspec.speculative.verify as verify_module
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams, filtered_probs
from blockspec.speculative.proposers import DFlashProposer, build_proposer
from test_ddtree import GREEDY, drafter, tiny_drafter, tiny_law  # noqa: F401 - fixtures
from test_lossless import ALPHA, exact_law_llm, law_fit
from test_sampled_tree import unrenormalised_proposal
from test_spec_greedy import prompts_for


def sampled_tree_llm(model, drafter, budget, topk=None):
    return exact_law_llm(model, 28, spec="ddtree", draft_model=drafter, budget=budget, topk=topk,
                         spec_verify="rejection")


@pytest.mark.parametrize("budget, topk, setting", [(4, None, "t13_topp_minp"), (8, None, "t1"), (16, 3, "t07_topk5")])
def test_sampled_tree_rejection_matches_exact_law(tiny_vocab_dir, tiny_drafter, tiny_law, budget, topk, setting):
    llm = sampled_tree_llm(tiny_vocab_dir, tiny_drafter, budget, topk)
    res = law_fit(llm, tiny_law, setting)
    assert res.p_value > ALPHA, f"{budget=} {setting=} chi2={res.statistic:.1f} p={res.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def test_sampled_tree_with_unrenormalised_q_fails(tiny_vocab_dir, tiny_drafter, tiny_law, monkeypatch):
    """Negative control: testing later siblings against q without renormalising it after the
    drawn siblings are removed over-accepts, and the exact-law test must see it."""
    monkeypatch.setattr(verify_module, "sibling_proposal", unrenormalised_proposal)
    # Static: the full budget every step, so every step has the later siblings the bias needs.
    llm = exact_law_llm(tiny_vocab_dir, 28, spec="ddtree", draft_model=tiny_drafter, budget=8,
                        spec_verify="rejection", spec_policy="static")
    assert law_fit(llm, tiny_law, "t1").p_value < ALPHA


@pytest.mark.parametrize("budget, topk", [(4, None), (16, None), (12, 3)])
def test_greedy_rows_equal_plain_greedy(qwen3_dir, drafter, budget, topk):
    """All-greedy batches and greedy rows beside sampled ones (the per-row rule) both give
    plain greedy output, token for token."""
    prompts = prompts_for(512, [5, 18, 9, 27], seed=8)
    expected = [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, GREEDY)]
    llm = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=budget, topk=topk, spec_verify="rejection")
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=64, seed=3, ignore_eos=True)
    mixed = llm.generate(prompts + prompts[:2], [GREEDY] * len(prompts) + [sampled] * 2)
    assert [o.token_ids for o in mixed[:len(prompts)]] == expected
    assert all(o.metrics.drafted_tokens > 0 for o in mixed)
    assert llm.engine.allocator.num_used_pages == 0


def test_seeded_sampled_row_same_alone_and_in_batch(qwen3_dir, drafter):
    # Seeded rows take the exponential race (blockspec/seeded_sampling.py): any policy, any batch.
    llm = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=8, spec_verify="rejection")
    prompts = prompts_for(512, [9, 4, 20], seed=2)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    alone = llm.generate(prompts[0], seeded)[0].token_ids
    others = [GREEDY, SamplingParams(temperature=1.0, top_k=20, max_tokens=30, ignore_eos=True)]
    assert llm.generate(prompts, [seeded] + others)[0].token_ids == alone
    assert llm.generate([prompts[2], prompts[0]], [others[1], seeded])[1].token_ids == alone


def test_a_sampled_row_without_q_is_refused(qwen3_dir, drafter):
    """A proposer that gives a tree but no q: sampled rows cannot be verified by rejection and
    are refused; greedy rows (which need no q) still run."""
    config = EngineConfig(model=qwen3_dir, spec="ddtree", draft_model=drafter, tree_budget=4, spec_verify="rejection")
    from blockspec.models.registry import load_config
    proposer = build_proposer(config, load_config(qwen3_dir))
    plain_propose = proposer.propose
    proposer.propose = lambda seqs, inputs, width=None: (plain_propose(seqs, inputs, width)[0], None)
    llm = LLM.from_engine(Engine(config, proposer=proposer))
    prompt = prompts_for(512, [7], seed=4)[0]
    assert llm.generate(prompt, GREEDY)[0].token_ids == LLM(model=qwen3_dir).generate(prompt, GREEDY)[0].token_ids
    with pytest.raises(ValueError, match="no draft distribution q"):
        llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=8, seed=1))


def test_rejection_is_accepted_for_ddtree_by_the_config_and_flags():
    from blockspec.engine_args import add_engine_arguments, engine_config_from_args
    import argparse
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--model", "m", "--draft-model", "d", "--spec", "ddtree", "--spec-verify", "rejection"])
    config = engine_config_from_args(args)
    config.validate()
    assert (config.spec, config.spec_verify) == ("ddtree", "rejection")


def test_auto_rule_verifies_sampled_rows_by_rejection_and_reports_it(qwen3_dir, drafter):
    """The default rule: rejection sampling where the proposer has a q (dflash, ddtree),
    target-only for n-gram; each request's spec_decoding says how it was verified."""
    engines = [LLM(model=qwen3_dir, spec=s, draft_model=drafter if s in ("dflash", "ddtree") else None).engine
               for s in ("dflash", "ddtree", "ngram", "none")]
    assert [e.verify_rule for e in engines] == ["rejection", "rejection", "target-only", "target-only"]
    assert LLM(model=qwen3_dir, spec="dflash", draft_model=drafter, spec_verify="target-only").engine.verify_rule \
        == "target-only"
    prompts = prompts_for(512, [6, 11], seed=4)
    sampled = SamplingParams(temperature=1.0, max_tokens=16, seed=5, ignore_eos=True)
    llm = LLM(model=qwen3_dir, spec="dflash", draft_model=drafter)
    assert llm.engine.spec_step.rejection
    outs = llm.generate(prompts, [GREEDY, sampled])
    assert [o.metrics.to_dict()["verify"] for o in outs] == ["greedy", "rejection"]
    assert LLM.aggregate_metrics(outs).verify == "mixed"
    ngram = LLM(model=qwen3_dir, spec="ngram").generate(prompts[:1], sampled)
    assert ngram[0].metrics.verify == "target-only"
    assert LLM(model=qwen3_dir).generate(prompts[:1], sampled)[0].metrics.verify == "none"


def test_verifying_against_the_filtered_q_fails(tiny_vocab_dir, tiny_drafter, tiny_law, monkeypatch):
    """Negative control for the law the children are drawn from (`tempered_probs`: the row's
    temperature, no truncation filters): testing them against the filtered q instead, which the
    chain's drafts come from, is a different law and the exact-law test must see it."""
    drawn_by = DFlashProposer.sampled_tree

    def tested_against_filtered_q(self, logits, inputs, budget):
        tree, _ = drawn_by(self, logits, inputs, budget)
        return tree, filtered_probs(logits, inputs.sampling)

    monkeypatch.setattr(DFlashProposer, "sampled_tree", tested_against_filtered_q)
    llm = exact_law_llm(tiny_vocab_dir, 28, spec="ddtree", draft_model=tiny_drafter, budget=8,
                        spec_verify="rejection", spec_policy="static")
    assert law_fit(llm, tiny_law, "t13_topp_minp").p_value < ALPHA
