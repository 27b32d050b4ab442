"""The bundled target + drafter: the default of LLM(), lossless greedy, English-like replies."""

import re

import pytest

from blockspec.bundled import DRAFTER_DIR, TARGET_DIR, default_model
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams

CHATS = [[{"role": "user", "content": "Write a short poem about the ocean."}],
         [{"role": "user", "content": "How do I sort a list in Python?"}]]
GREEDY = SamplingParams(temperature=0, max_tokens=48)


@pytest.fixture(scope="module")
def plain():
    return LLM(model=str(TARGET_DIR)).chat(CHATS, GREEDY)


def test_default_is_the_bundled_pair_with_speculation():
    assert default_model() == (str(TARGET_DIR), str(DRAFTER_DIR), "dflash")
    for f in list(TARGET_DIR.glob("*.safetensors")) + list(DRAFTER_DIR.glob("*.safetensors")):
        assert f.stat().st_size <= 16 * 2**20, f
    total = sum(f.stat().st_size for f in list(TARGET_DIR.iterdir()) + list(DRAFTER_DIR.iterdir()))
    assert total <= 32 * 2**20


@pytest.mark.parametrize("kwargs", [{}, {"spec": "ddtree", "budget": 16}, {"spec": "ddtree", "budget": 4}])
def test_bundled_speculative_greedy_equals_plain(plain, kwargs):
    llm = LLM(**kwargs)
    outs = llm.chat(CHATS, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert LLM.aggregate_metrics(outs).accept_length > 1


def test_bundled_replies_are_english_like(plain):
    for out in plain:
        words = re.findall(r"[A-Za-z]+", out.text)
        assert len(words) >= 10, out.text
        assert sum(len(w) for w in words) / max(1, len(out.text.replace(" ", ""))) > 0.6, out.text


def test_bundled_drafter_accepts_three_tokens_a_step_on_held_out_chats():
    """Issue criterion: accept length ≥ 3.0 at block 16, T=0, held-out ShareGPT prompts (measured
    here on 16 prompts × 64 tokens, float32 on CPU: 3.47; 4.53 on 32 × 128, bench/results)."""
    from blockspec.bench.acceptance import load_prompt_sets, measure

    llm = LLM(spec_policy="static")                                 # the drafter at its full block
    assert llm.engine.proposer.max_depth == 15                      # block 16
    prompts = load_prompt_sets(llm.tokenizer, 16, ["sharegpt"])["sharegpt"]
    result = measure(llm, prompts, 0.0, 64, 16)
    assert result["accept_length"] >= 3.0, result
