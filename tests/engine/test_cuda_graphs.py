"""Graphed verify steps equal eager ones: every bucket, batches that shrink through the buckets
and overflow the largest, mixed greedy and seeded sampled rows, none/ngram/dflash/ddtree.

On CPU `GraphedVerify` runs the step on its static buffers instead of replaying a graph, which
checks the buffer handling (padding rows on page 0, stale page-table columns, slicing); on a CUDA
machine the same tests capture and replay real graphs (`pytest tests/engine/test_cuda_graphs.py`).
"""

from __future__ import annotations

import logging

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.cuda_graphs import batch_buckets
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["reference", "triton"] if DEVICE == "cuda" else ["reference"]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, qwen3_dir):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("d"), qwen3_dir, block_size=5))


def run(engine, requests):
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    got = {rid: [] for rid, _, _ in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    return got


def requests(n=7):
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        prompt = torch.randint(0, 400, (3 + 2 * i,), generator=gen).tolist()
        # The last (greedy) request outlives the others: its steps run as an all-greedy batch.
        n_tokens = 4 + 2 * i if i < n - 1 else 40
        params = (SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True) if i % 2 == 0 else
                  SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i, max_tokens=n_tokens, ignore_eos=True))
        out.append((f"r{i}", prompt, params))
    return out


def engine_for(model, spec, drafter, graphs: bool, max_bs: int = 4, backend: str = "reference"):
    cfg = EngineConfig(model=model, device=DEVICE, spec=spec, draft_model=drafter if spec in ("dflash", "ddtree") else None,
                       tree_budget=6 if spec == "ddtree" else None, cuda_graph=graphs, cuda_graph_max_bs=max_bs,
                       attention_backend=backend)
    engine = Engine(cfg)
    if graphs and engine.graphed is None:        # CPU: no graphs by default; use the static buffers
        engine.graphed = engine.capture_graphs()
    return engine


def test_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert batch_buckets(5) == [1, 2, 4, 5]


def graphed_run(qwen3_dir, drafter, spec, max_bs, caplog, backend="reference"):
    """Outputs of the eager and the graphed engine, and the (batch, bucket) of each graphed step."""
    reqs = requests()
    eager = run(engine_for(qwen3_dir, spec, drafter, graphs=False, backend=backend), reqs)
    graphed_engine = engine_for(qwen3_dir, spec, drafter, graphs=True, max_bs=max_bs, backend=backend)
    graphed_fn, used = graphed_engine.graphed, []

    def spy(inputs, tree):
        B, bucket = inputs.batch_size, graphed_fn.bucket_for(inputs.batch_size)
        out = graphed_fn(inputs, tree)
        # Padding rows (a batch of 3 in the bucket of 4) point at page 0 only: never a live page.
        assert graphed_fn.static[bucket, inputs.all_greedy].packed.page_table[B:].eq(0).all()
        used.append((B, bucket, inputs.all_greedy))
        return out

    spy.can_run = graphed_fn.can_run
    graphed_engine.graphed = spy
    with caplog.at_level(logging.WARNING, logger="blockspec.cuda_graphs"):
        graphed = run(graphed_engine, reqs)
    return eager, graphed, used


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", ["none", "ngram", "dflash", "ddtree"])
def test_graphed_steps_equal_eager(qwen3_dir, drafter, spec, backend, caplog):
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 4, caplog, backend)
    assert graphed == eager
    assert {1, 2, 4} <= {bucket for _, bucket, _ in used}    # the batch shrank through every bucket
    assert {True, False} <= {greedy for _, _, greedy in used}  # all-greedy batches and sampled ones
    assert any("exceeds the largest CUDA graph" in r.message for r in caplog.records)  # 7 > 4: eager, logged


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_padded_buckets_equal_eager(qwen3_dir, drafter, spec, caplog):
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 8, caplog)
    assert graphed == eager
    assert (7, 8, False) in used                               # 7 rows padded to the bucket of 8
