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


SEEDED = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
SEEDED_CASES = [("none", "static", "auto"), ("dflash", "static", "rejection"), ("dflash", "static", "target-only"),
                ("ngram", "static", "auto"), ("dflash", "adaptive", "auto"), ("ngram", "adaptive", "auto"),
                ("ddtree", "adaptive", "auto"), ("ddtree", "static", "target-only")]


@pytest.fixture(scope="module")
def seeded_plain(qwen3_dir):
    """Seeded plain decoding of the first prompt: what every speculative engine must repeat."""
    prompts = prompts_for(512, [9, 4, 20, 13], seed=2)
    return prompts, LLM(model=qwen3_dir).generate(prompts[0], SEEDED)[0].token_ids


@pytest.mark.parametrize("spec, policy, verify", SEEDED_CASES)
def test_seeded_request_repeats_plain_decoding_alone_and_in_batch(qwen3_dir, tmp_path, seeded_plain, spec, policy,
                                                                   verify):
    """A seeded sampled row samples by the exponential race (blockspec/seeded_sampling.py): its
    tokens are seeded plain decoding's whatever the method, the verifier (ddtree under auto: sampled
    trees), the width (adaptive: here changing every step) or the rows beside it."""
    kwargs = dict(spec_policy=policy, spec_verify=verify) if spec != "none" else {}
    if spec in ("dflash", "ddtree"):
        kwargs.update(spec=spec, draft_model=str(write_dflash_drafter(tmp_path / "d", qwen3_dir, block_size=6)),
                      **({"budget": 7} if spec == "ddtree" else {}))
    elif spec == "ngram":
        kwargs.update(spec="ngram", block_size=4)
    llm = LLM(model=qwen3_dir, **kwargs)
    if policy == "adaptive":      # a policy that changes width every step, whatever the timings
        widths = iter(__import__("itertools").cycle(llm.engine.policy.widths))
        llm.engine.policy._choose = lambda seqs, ids: next(widths)
    prompts, plain = seeded_plain
    alone = llm.generate(prompts[0], SEEDED)[0].token_ids
    assert alone == plain
    others = [SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True) for n in (5, 30, 17)]
    batch = llm.generate(prompts, [SEEDED] + others)
    assert batch[0].token_ids == alone
    if policy == "adaptive":     # the widths did change under the seeded row
        assert len(batch[0].metrics.configurations) > 1, batch[0].metrics.configurations
    again = llm.generate([prompts[2], prompts[0]], [others[1], SEEDED])
    assert again[1].token_ids == alone
    different_seed = llm.generate(prompts[0], SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24,
                                                              seed=99, ignore_eos=True))[0].token_ids
    assert different_seed != alone
