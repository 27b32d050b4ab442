"""Prefill warm-up: the widths cover every power-of-two class, and the warm-up leaves the cache's
live pages and the engine's output untouched (it writes page 0 only)."""

from __future__ import annotations

import torch

from blockspec.engine.warmup import warm_up_prefill, warm_up_widths
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams


def test_warm_up_widths():
    assert warm_up_widths(1) == [1]
    assert warm_up_widths(20) == [1, 2, 3, 4, 5, 8, 9, 16, 17]
    assert warm_up_widths(2048)[-3:] == [1024, 1025, 2048]


def test_warm_up_writes_page_zero_only_and_changes_no_output(qwen3_dir):
    llm = LLM(model=qwen3_dir, dtype="float32", device="cpu")
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    before = llm.generate([[5, 6, 7, 8, 9]], params)[0].token_ids
    page = engine.cache.page_size
    live_k = engine.cache.k[:, page:].clone()
    widths = warm_up_prefill(engine.runner, engine.proposer, page, 40)
    assert widths[-1] == 33
    assert torch.equal(engine.cache.k[:, page:], live_k)          # only page 0 was written
    assert not torch.equal(engine.cache.k[:, :page], torch.zeros_like(engine.cache.k[:, :page]))
    assert llm.generate([[5, 6, 7, 8, 9]], params)[0].token_ids == before
