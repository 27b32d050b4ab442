"""The default K/V cache lets even a single running request use its whole context while
speculating (the verify step writes `lookahead` positions past the committed length)."""

import pytest

from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter


def test_one_request_engine_fits_a_full_context_with_a_wide_tree(qwen3_dir, tmp_path):
    drafter = str(write_dflash_drafter(tmp_path / "d", qwen3_dir, block_size=8))
    llm = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=64, max_running_requests=1)
    max_len = llm.engine.max_model_len
    prompt = [5] * (max_len - 4)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert llm.engine.allocator.num_used_pages == 0


def test_too_small_a_cache_names_the_lookahead(qwen3_dir, tmp_path):
    drafter = str(write_dflash_drafter(tmp_path / "d", qwen3_dir, block_size=8))
    llm = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=64, kv_cache_tokens=64)
    with pytest.raises(ValueError, match=r"lookahead \(65\).*kv_cache_tokens"):
        llm.generate([5] * 10, SamplingParams(temperature=0, max_tokens=4))
