"""Stops that fall inside an accepted block cut exactly where plain decoding stops; a seeded
request gives the same tokens alone and inside a batch, with and without speculation."""

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter
from test_spec_greedy import OracleProposer, prompts_for


@pytest.fixture(scope="module")
def setup(qwen3_dir):
    prompts = prompts_for(512, [8, 15], seed=11)
    plain = LLM(model=qwen3_dir)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    cont = [o.token_ids for o in plain.generate(prompts, greedy)]
    return plain, prompts, cont


def oracle_llm(model_dir, prompts, cont, num_draft=7):
    oracle = OracleProposer({tuple(p): c for p, c in zip(prompts, cont)}, num_draft)
    return LLM.from_engine(Engine(EngineConfig(model=model_dir, spec="dflash", spec_policy="static"), proposer=oracle))


def test_stop_token_inside_accepted_block(qwen3_dir, setup):
    plain, prompts, cont = setup
    stop_tok = cont[0][10]  # a token the oracle will propose inside a block
    params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_tok], ignore_eos=True)
    expected = plain.generate(prompts, params)
    got = oracle_llm(qwen3_dir, prompts, cont).generate(prompts, params)
    for e, g in zip(expected, got):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason)
    assert got[0].token_ids[-1] == stop_tok and got[0].finish_reason == "stop"
    assert len(got[0].token_ids) == cont[0].index(stop_tok) + 1


def test_eos_inside_accepted_block(qwen3_dir, setup):
    plain, prompts, cont = setup
    eos = cont[1][13]
    llm_plain = LLM(model=qwen3_dir)
    llm_plain.engine.eos_ids = {eos}
    spec = oracle_llm(qwen3_dir, prompts, cont)
    spec.engine.eos_ids = {eos}
    params = SamplingParams(temperature=0, max_tokens=40)
    e = llm_plain.generate(prompts[1], params)[0]
    g = spec.generate(prompts[1], params)[0]
    assert g.token_ids == e.token_ids and g.finish_reason == e.finish_reason == "stop"
    assert g.token_ids[-1] == eos


def test_max_tokens_inside_accepted_block(qwen3_dir, setup):
    plain, prompts, cont = setup
    params = SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)
    got = oracle_llm(qwen3_dir, prompts, cont).generate(prompts, params)
    for g, c in zip(got, cont):
        assert g.token_ids == c[:11] and g.finish_reason == "length"


def test_stop_string_inside_accepted_block(qwen3_dir, setup):
    plain, prompts, cont = setup
    text = plain.tokenizer.decode(cont[0])
    stop = text[len(text) // 3: len(text) // 3 + 3]
    assert stop.strip(), "fixture text too short"
    params = SamplingParams(temperature=0, max_tokens=40, stop=[stop], ignore_eos=True)
    e = plain.generate(prompts[0], params)[0]
    g = oracle_llm(qwen3_dir, prompts, cont).generate(prompts[0], params)[0]
    assert (g.token_ids, g.text, g.finish_reason) == (e.token_ids, e.text, e.finish_reason)
    assert e.finish_reason == "stop" and stop not in e.text
    assert text.startswith(e.text)


@pytest.mark.parametrize("spec, policy", [("none", "static"), ("dflash", "static"), ("ngram", "static"),
                                          ("dflash", "adaptive"), ("ngram", "adaptive"), ("ddtree", "adaptive")])
def test_seeded_request_same_alone_and_in_batch(qwen3_dir, tmp_path, spec, policy):
    # Adaptive: a seeded sampled row's width comes from its own history only (engine/seeded_widths.py),
    # a cap inside whatever width the other rows' policy (here cycling every step) chose.
    kwargs = {}
    if spec in ("dflash", "ddtree"):   # ddtree: sampled trees (spec_verify auto = rejection)
        kwargs = dict(spec=spec, draft_model=str(write_dflash_drafter(tmp_path / "d", qwen3_dir, block_size=6)),
                      spec_policy=policy, **({"budget": 7} if spec == "ddtree" else {}))
    elif spec == "ngram":
        kwargs = dict(spec="ngram", block_size=4, spec_policy=policy)
    llm = LLM(model=qwen3_dir, **kwargs)
    if policy == "adaptive":      # a policy that changes width every step, whatever the timings
        widths = iter(__import__("itertools").cycle(llm.engine.policy.widths))
        llm.engine.policy._choose = lambda B, seqs: next(widths)
    prompts = prompts_for(512, [9, 4, 20, 13], seed=2)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    alone = llm.generate(prompts[0], seeded)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True) for n in (5, 30, 17)]
    batch = llm.generate(prompts, [seeded] + others)
    assert batch[0].token_ids == alone
    if policy == "adaptive":     # the seeded row did adapt: it ran more than one width
        assert len(batch[0].metrics.configurations) > 1, batch[0].metrics.configurations
    again = llm.generate([prompts[2], prompts[0]], [others[1], seeded])
    assert again[1].token_ids == alone
    different_seed = llm.generate(prompts[0], SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24,
                                                              seed=99, ignore_eos=True))[0].token_ids
    assert different_seed != alone
