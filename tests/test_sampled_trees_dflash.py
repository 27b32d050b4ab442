"""Linear DFlash with `sampled_trees`: sampled rows draft trees whose children are draws from q
(recursive rejection sampling), greedy rows keep the argmax chain, in one verify.

Lossless: the exact joint law of the first tokens (tests/test_lossless.py style) for sampled
rows batched beside greedy ones, with a wrong residual rule failing it; greedy rows equal plain
greedy decoding; each row drafts the shape it should; the acceptance model splits its rows by
shape (engine/split_acceptance.py); the setting is refused where it cannot apply."""

import argparse

import pytest
import torch

import blockspec.speculative.verify as verify_module
from blockspec.engine.acceptance import AcceptanceModel
from blockspec.engine.chain_acceptance import ChainAcceptance
from blockspec.engine.config import EngineConfig
from blockspec.engine.split_acceptance import SplitAcceptance
from blockspec.engine_args import add_engine_arguments, engine_config_from_args
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.validation.lossless import chi_square_against_law
from test_ddtree import GREEDY, drafter, tiny_drafter, tiny_law  # noqa: F401 - fixtures
from test_lossless import ALPHA, NUM_SAMPLES, NUM_TOKENS, PROMPT, SETTINGS, exact_law_llm
from test_sampled_tree import unrenormalised_proposal
from test_spec_greedy import prompts_for


def mixed_law_fit(llm, laws, setting, greedy_rows=500):
    """Chi-square of NUM_SAMPLES unseeded sampled requests' first tokens, submitted in one batch
    with `greedy_rows` greedy requests of the same prompt (so steps verify chains and trees
    together), against the exact law of `setting`."""
    fields = {k: getattr(SETTINGS[setting], k) for k in ("temperature", "top_p", "top_k", "min_p")}
    sampled = SamplingParams(**fields, max_tokens=NUM_TOKENS, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    every = NUM_SAMPLES // greedy_rows
    params = [p for i in range(NUM_SAMPLES) for p in ([sampled, greedy] if i % every == 0 else [sampled])]
    outs = llm.generate([PROMPT] * len(params), params)
    samples = [tuple(o.token_ids[:NUM_TOKENS]) for o, p in zip(outs, params) if not p.greedy]
    greedy_texts = {tuple(o.token_ids) for o, p in zip(outs, params) if p.greedy}
    assert len(greedy_texts) == 1                       # greedy rows beside sampled ones: one text
    return chi_square_against_law(samples, laws[setting])


def hybrid_llm(model, drafter, **kw):
    return exact_law_llm(model, 28, spec="dflash", draft_model=drafter, sampled_trees=True, **kw)


@pytest.mark.parametrize("setting", ["t1", "t13_topp_minp"])
def test_sampled_rows_beside_greedy_ones_match_the_exact_law(tiny_vocab_dir, tiny_drafter, tiny_law, setting):
    llm = hybrid_llm(tiny_vocab_dir, tiny_drafter, spec_policy="static")
    res = mixed_law_fit(llm, tiny_law, setting)
    assert res.p_value > ALPHA, f"{setting=} chi2={res.statistic:.1f} p={res.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def test_a_wrong_residual_fails_the_same_test(tiny_vocab_dir, tiny_drafter, tiny_law, monkeypatch):
    """Negative control: later siblings tested against q without renormalising it after the
    elder siblings' tokens are removed over-accept, and the test must see it."""
    monkeypatch.setattr(verify_module, "sibling_proposal", unrenormalised_proposal)
    llm = hybrid_llm(tiny_vocab_dir, tiny_drafter, spec_policy="static")
    assert mixed_law_fit(llm, tiny_law, "t1").p_value < ALPHA


def test_greedy_rows_equal_plain_greedy_and_draft_chains(qwen3_dir, drafter):
    """Greedy rows, alone or beside sampled ones, give plain greedy output and draft the argmax
    chain; sampled rows draft branching trees; configurations name each row's shape."""
    prompts = prompts_for(512, [5, 18, 9, 27], seed=8)
    expected = [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, GREEDY)]
    llm = LLM(model=qwen3_dir, spec="dflash", draft_model=drafter, sampled_trees=True, spec_policy="static")
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    step = llm.engine.spec_step
    seen = []
    real = step.verify_accept

    def recording(runner, inputs, tree, draft_probs=None):
        seen.append((inputs.sampling.greedy.tolist(), tree.parents.clone(), tree.is_chain))
        return real(runner, inputs, tree, draft_probs)

    step.verify_accept = recording
    sampled = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    mixed = llm.generate(prompts + prompts[:2], [GREEDY] * len(prompts) + [sampled] * 2)
    assert [o.token_ids for o in mixed[:len(prompts)]] == expected
    chain = torch.arange(-1, 7)                          # block 8: the root then 7 drafts in a line
    branched = False
    for greedy, parents, is_chain in seen:
        for row, g in enumerate(greedy):
            if g:
                assert torch.equal(parents[row], chain)
            else:
                real_parents = parents[row][parents[row] >= 0]
                branched |= len(set(real_parents.tolist())) < len(real_parents)
        assert is_chain or not all(greedy)             # an all-greedy batch is DFlash's chain step
    assert branched
    assert [o.metrics.configurations for o in mixed[-3:]] == [{"chain8": o.metrics.verify_steps} for o in mixed[-3:-2]] \
        + [{"tree7": o.metrics.verify_steps} for o in mixed[-2:]]
    assert llm.engine.allocator.num_used_pages == 0


def test_the_acceptance_model_splits_rows_by_shape():
    """Greedy rows feed and read the chain model, sampled rows the tree model: a mixed batch's
    totals are the two models' totals over their rows, as two models fed apart would give."""
    widths = [1, 2, 4, 8]
    split, chain, tree = SplitAcceptance(widths), ChainAcceptance(widths), AcceptanceModel(widths)
    classes = {"g1": "greedy", "s1": "t<=1", "g2": "greedy", "s2": "t<=1"}
    ids = ["g1", "s1", "g2", "s2"]
    klass_of = lambda i: classes[ids[i]]  # noqa: E731
    paths = {"g1": [1, 2, 3], "s1": [1, 4], "g2": [], "s2": [2]}
    for width in (8, 4, 8, 1, 1, 8):
        split.observe_step(ids, klass_of, [paths[i] for i in ids], width)
        chain.observe_step(["g1", "g2"], lambda i: "greedy", [paths["g1"], paths["g2"]], width)
        tree.observe_step(["s1", "s2"], lambda i: "t<=1", [paths["s1"], paths["s2"]], width)
    both = chain.expected_totals(["g1", "g2"], lambda i: "greedy")
    for w, t in tree.expected_totals(["s1", "s2"], lambda i: "t<=1").items():
        both[w] += t
    assert split.expected_totals(ids, klass_of) == pytest.approx(both)
    assert split.expected_totals(["s1", "s2"], klass_of) == tree.expected_totals(["s1", "s2"], None)
    # After a plain step both parts keep plain stretches, extended together; another batch is not.
    assert not split.extend_stretch(ids)
    split.observe_step(ids, klass_of, [[] for _ in ids], 1)
    chain.observe_step(["g1", "g2"], None, [[], []], 1)
    tree.observe_step(["s1", "s2"], None, [[], []], 1)
    assert split.extend_stretch(ids) and chain.extend_stretch(["g1", "g2"]) and tree.extend_stretch(["s1", "s2"])
    assert not split.extend_stretch(["g1", "s1"])
    both = chain.expected_totals(["g1", "g2"], None)
    for w, t in tree.expected_totals(["s1", "s2"], None).items():
        both[w] += t
    assert split.expected_totals(ids, klass_of) == pytest.approx(both)
    split.forget("s2")
    assert split.expected_totals(["g1"], klass_of) == chain.expected_totals(["g1"], None)


def test_the_setting_is_refused_where_it_cannot_apply():
    for kw, words in (({"spec": "ddtree", "draft_model": "d"}, "spec 'dflash', got spec 'ddtree'"),
                      ({"spec": "none"}, "spec 'dflash', got spec 'none'"),
                      ({"spec": "dflash", "draft_model": "d", "spec_verify": "target-only"}, "spec_verify")):
        with pytest.raises(ValueError, match=f"sampled_trees.*{words}"):
            EngineConfig(model="m", sampled_trees=True, **kw).validate()
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    config = engine_config_from_args(parser.parse_args(["--model", "m", "--draft-model", "d", "--spec", "dflash",
                                                                  "--sampled-trees"]))
    assert config.sampled_trees and config.spec == "dflash"
    assert not engine_config_from_args(parser.parse_args(["--model", "m"])).sampled_trees
