"""Graphed prefills (engine/prefill_graphs.py) commit exactly what eager prefills commit.

A prefill pads to its (rows, width) bucket: padding columns and padding rows write page 0 only
and are never read. On CPU the bucket's function runs on its static buffers (no capture), which
checks that padding; on a CUDA machine the same tests replay real graphs.
"""

from __future__ import annotations

import pytest
import torch

from blockspec.engine.prefill_graphs import GraphedPrefill
from blockspec.sampling import SamplingParams
from graph_fixtures import engine_for, run


def with_prefill_graphs(engine):
    """The engine with graphed prefills (on CPU: the static buffers), and a log of their use."""
    if engine.graphed_prefill is None:
        engine.graphed_prefill = GraphedPrefill(engine.runner, engine.proposer, engine.page_tables.max_pages,
                                                engine.config.page_size, engine.config.max_prefill_tokens,
                                                engine.device)
        engine.graphed_prefill.capture()
    graphed, used = engine.graphed_prefill, []

    def spy(inputs):
        out = graphed(inputs)
        used.append((tuple(inputs.input_ids.shape), out is not None, int(inputs.prefix_lens.max())))
        if out is not None:
            st = graphed.static[graphed.bucket_for(*inputs.input_ids.shape)]
            assert st.page_table[inputs.batch_size:].eq(0).all()          # padding rows: page 0 only
        return out

    engine.graphed_prefill = spy
    return used


def prompts(n, seed=3):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(0, 400, (2 + 7 * i,), generator=gen).tolist()   # 2 … 44 tokens
        params = (SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True) if i % 2 == 0 else
                  SamplingParams(temperature=0.8, top_p=0.9, seed=40 + i, max_tokens=6, ignore_eos=True))
        out.append((f"r{i}", prompt, params))
    return out


@pytest.mark.parametrize("spec", ["none", "dflash"])
def test_graphed_prefills_equal_eager(qwen3_dir, drafter, spec):
    reqs = prompts(7)
    expected = run(engine_for(qwen3_dir, spec, drafter, graphs=False, max_prefill_tokens=64), reqs)
    engine = engine_for(qwen3_dir, spec, drafter, graphs=False, max_prefill_tokens=64)
    used = with_prefill_graphs(engine)
    assert run(engine, reqs) == expected
    assert any(ok and shape[0] > 1 for shape, ok, _ in used)               # a multi-row admission, padded
    assert any(ok and shape[0] == 1 for shape, ok, _ in used)


def test_chunked_and_oversized_prefills(qwen3_dir, drafter):
    """Chunks after the first start at a cached prefix; a prefill of more rows than the largest
    bucket runs eagerly (and still equals)."""
    long = [("long", torch.arange(5, 75).tolist(), SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))]
    short = [(f"s{i}", [7 + i, 8], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)) for i in range(17)]
    reqs = short + long + prompts(3, seed=9)       # the 17 short prompts are admitted together
    expected = run(engine_for(qwen3_dir, "dflash", drafter, graphs=False, max_prefill_tokens=40), reqs)
    engine = engine_for(qwen3_dir, "dflash", drafter, graphs=False, max_prefill_tokens=40)
    used = with_prefill_graphs(engine)
    assert run(engine, reqs) == expected
    assert any(not ok and shape[0] > 16 for shape, ok, _ in used)          # 17 rows: eager
    assert any(ok and prefix > 0 for _, ok, prefix in used)                # a later chunk, graphed
