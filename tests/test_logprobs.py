"""logprobs are the target's raw log-probabilities at the position that produced each token,
equal to transformers' float32 forward on CPU within 1e-4, on plain, DFlash and DDTree steps
(including the first token, sampled after the prefill), whatever penalties or filters apply."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter
from test_ddtree import DecoyTreeOracle
from test_spec_greedy import OracleProposer, prompts_for

K = 5


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("lp_drafter"), qwen3_dir, block_size=8))


@pytest.fixture(scope="module")
def hf(qwen3_dir):
    return AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()


def direct_logprobs(hf, prompt: list[int], output: list[int]) -> torch.Tensor:
    """`[len(output), V]` log_softmax of the forward on prompt + output, at each output token's position."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(output)].float(), -1)


@pytest.mark.parametrize("spec, extra", [("none", {}), ("ddtree", {"budget": 8}),
                                         ("dflash", {"spec_verify": "rejection"})])
def test_logprobs_equal_a_direct_target_forward(qwen3_dir, drafter, hf, spec, extra):
    spec_args = {} if spec == "none" else {"spec": spec, "draft_model": drafter, **extra}
    llm = LLM(model=qwen3_dir, **spec_args)
    prompts = prompts_for(512, [4, 9, 14], seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=K),
              SamplingParams(temperature=0.9, top_p=0.9, seed=4, max_tokens=20, ignore_eos=True, logprobs=K,
                             presence_penalty=0.5, logit_bias={5: 3.0}),
              SamplingParams(temperature=1.0, seed=5, max_tokens=20, ignore_eos=True)]
    outs = llm.generate(prompts, params)
    assert outs[2].logprobs is None
    for prompt, out in zip(prompts[:2], outs[:2]):
        check_against_forward(hf, prompt, out)


def check_against_forward(hf, prompt, out) -> None:
    assert [lp.token_id for lp in out.logprobs] == out.token_ids
    want = direct_logprobs(hf, prompt, out.token_ids)
    for d, lp in enumerate(out.logprobs):
        assert abs(lp.logprob - want[d, lp.token_id].item()) < 1e-4
        ids, values = zip(*lp.top)
        assert list(values) == sorted(values, reverse=True) and len(values) == K
        torch.testing.assert_close(torch.tensor(values), want[d].topk(K).values, rtol=0, atol=1e-4)
        torch.testing.assert_close(want[d, list(ids)], torch.tensor(values), rtol=0, atol=1e-4)


def test_accepted_drafts_get_the_logprobs_of_their_verify_node(qwen3_dir, hf):
    """Oracle drafts are all accepted: most tokens come from draft positions, in a chain and in a
    tree whose accepted path has gaps (node indices 2, 4, 6, …), with a penalty changing the
    sampled distribution but not the (raw) logprobs."""
    prompt = prompts_for(512, [7], seed=12)[0]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=K, repetition_penalty=1.3)
    cont = LLM(model=qwen3_dir).generate([prompt], params)[0].token_ids
    for spec, proposer in [("dflash", OracleProposer({tuple(prompt): cont}, 4)), ("ddtree", DecoyTreeOracle(cont, 4, 512))]:
        (out,) = LLM.from_engine(Engine(EngineConfig(model=qwen3_dir, spec=spec), proposer=proposer)).generate(
            [prompt], params)
        assert out.token_ids == cont and out.metrics.accepted_tokens >= 12
        check_against_forward(hf, prompt, out)


def test_logprobs_zero_gives_the_chosen_token_only_and_stops_cut_them(qwen3_dir):
    llm = LLM(model=qwen3_dir)
    prompt = prompts_for(512, [6], seed=8)[0]
    full = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0))[0]
    assert all(lp.top == [] for lp in full.logprobs) and len(full.logprobs) == 12
    stop_at = full.token_ids[3]
    cut = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, logprobs=2,
                                                stop_token_ids=[stop_at]))[0]
    assert len(cut.logprobs) == len(cut.token_ids) == full.token_ids.index(stop_at) + 1
