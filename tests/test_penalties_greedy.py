"""Greedy decoding with penalties and logit_bias: plain decoding equals a direct per-step
statement of the rule on transformers' forward; speculative (DFlash chains, DDTree trees)
equals plain; drafts of the penalised continuation are all accepted, through chains and through
trees whose accepted path has gaps (each verify node is penalised with its own path)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.validation.lossless import reference_processed_logits
from dflash_fixtures import write_dflash_drafter
from test_ddtree import DecoyTreeOracle
from test_spec_greedy import OracleProposer, prompts_for

PENALTIES = {
    "repetition": dict(repetition_penalty=1.6),
    "presence_frequency_bias": dict(presence_penalty=1.2, frequency_penalty=0.6, logit_bias={7: 4.0, 11: -100.0}),
    "negative_frequency_bias": dict(frequency_penalty=-0.8, repetition_penalty=0.9, logit_bias={3: 2.5}),
}
NUM_TOKENS = 24


def greedy(**penalties) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, **penalties)


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("pen_drafter"), qwen3_dir, block_size=8))


@pytest.fixture(scope="module")
def prompts():
    return prompts_for(512, [5, 11, 17], seed=21)


@pytest.fixture(scope="module")
def plain(qwen3_dir, prompts):
    llm = LLM(model=qwen3_dir)
    return {name: [o.token_ids for o in llm.generate(prompts, greedy(**p))] for name, p in PENALTIES.items()}


@pytest.mark.parametrize("name", list(PENALTIES))
def test_plain_penalised_greedy_equals_the_rule_on_transformers(qwen3_dir, prompts, plain, name):
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    params = greedy(**PENALTIES[name])
    prompt, output = prompts[0], []
    with torch.no_grad():
        for _ in range(NUM_TOKENS):
            logits = hf(torch.tensor([prompt + output])).logits[0, -1]
            output.append(int(reference_processed_logits(logits, prompt, output, params).argmax()))
    assert plain[name][0] == output
    unpenalised = LLM(model=qwen3_dir).generate([prompt], greedy())[0].token_ids
    assert output != unpenalised  # the setting changes the output, so the comparison means something


@pytest.mark.parametrize("spec, extra", [("dflash", {}), ("ddtree", {"budget": 12, "topk": 3})])
def test_speculative_penalised_greedy_equals_plain(qwen3_dir, drafter, prompts, plain, spec, extra):
    llm = LLM(model=qwen3_dir, spec=spec, draft_model=drafter, **extra)
    names = list(PENALTIES)
    params = [greedy(**PENALTIES[n]) for n in names for _ in prompts]   # settings mixed in one batch
    outs = llm.generate([p for _ in names for p in prompts], params)
    assert [o.token_ids for o in outs] == [t for n in names for t in plain[n]]
    assert llm.engine.allocator.num_used_pages == 0


@pytest.mark.parametrize("name", list(PENALTIES))
def test_drafts_of_the_penalised_continuation_are_all_accepted(qwen3_dir, prompts, plain, name):
    params = greedy(**PENALTIES[name])
    chain = LLM.from_engine(Engine(EngineConfig(model=qwen3_dir, spec="dflash", spec_policy="static"),
                                   proposer=OracleProposer({tuple(p): c for p, c in zip(prompts, plain[name])}, 5)))
    outs = chain.generate(prompts, params)
    assert [o.token_ids for o in outs] == plain[name]
    for o in outs:  # a draft is rejected only when the penalised target disagrees with its path's history
        assert o.metrics.accepted_tokens == o.metrics.drafted_tokens > 0
    tree = LLM.from_engine(Engine(EngineConfig(model=qwen3_dir, spec="ddtree", spec_policy="static"),
                                  proposer=DecoyTreeOracle(plain[name][0], 4, 512)))
    (out,) = tree.generate([prompts[0]], params)
    assert out.token_ids == plain[name][0]
    assert 2 * out.metrics.accepted_tokens == out.metrics.drafted_tokens > 0  # every right node, no decoy
