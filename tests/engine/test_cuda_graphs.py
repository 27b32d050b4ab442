"""Graphed verify steps equal eager ones: every bucket, batches that shrink through the buckets
and overflow the largest, mixed greedy and seeded sampled rows, none/ngram/dflash/ddtree.

On CPU `GraphedVerify` runs the step on its static buffers instead of replaying a graph, which
checks the buffer handling (padding rows on page 0, stale page-table columns, slicing); on a CUDA
machine the same tests capture and replay real graphs (`pytest tests/engine/test_cuda_graphs.py`).
"""

from __future__ import annotations

import logging

import pytest

from blockspec.engine.cuda_graphs import batch_buckets
from blockspec.sampling import SAMPLING_VARIANTS, SamplingParams
from graph_fixtures import DEVICE, GraphSpy, cycling_widths, engine_for, requests, run

BACKENDS = ["reference", "triton"] if DEVICE == "cuda" else ["reference"]


def test_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert batch_buckets(5) == [1, 2, 4, 5]


def graphed_run(qwen3_dir, drafter, spec, max_bs, caplog, backend="reference", reqs=None, **settings):
    """Outputs of the eager and the graphed engine on `reqs` (default `requests()`), and the
    (batch, bucket, sampling variant, width) of each graphed step."""
    reqs = reqs or requests()
    eager = run(engine_for(qwen3_dir, spec, drafter, graphs=False, backend=backend, **settings), reqs)
    graphed_engine = engine_for(qwen3_dir, spec, drafter, graphs=True, max_bs=max_bs, backend=backend, **settings)
    spy = graphed_engine.graphed = GraphSpy(graphed_engine.graphed)
    with caplog.at_level(logging.WARNING, logger="blockspec.cuda_graphs"):
        graphed = run(graphed_engine, reqs)
    return eager, graphed, [u[:3] for u in spy.used] if not settings else spy.used


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", ["none", "ngram", "dflash", "ddtree"])
def test_graphed_steps_equal_eager(qwen3_dir, drafter, spec, backend, caplog):
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 4, caplog, backend)
    assert graphed == eager
    assert {1, 2, 4} <= {bucket for _, bucket, _ in used}    # the batch shrank through every bucket
    assert {v for _, _, v in used} == {"greedy", "filtered"}  # all-greedy batches and sampled ones (top_p)
    assert any("exceeds the largest CUDA graph" in r.message for r in caplog.records)  # 7 > 4: eager, logged


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_trees_graphed_steps_equal_eager(qwen3_dir, drafter, backend, caplog):
    """DFlash with sampled trees: all-greedy batches replay the chain step's graph, batches with
    sampled rows the tree step's (greedy rows chains, sampled ones trees), equal to eager."""
    eager, graphed, used = graphed_run(qwen3_dir, drafter, "dflash", 4, caplog, backend, sampled_trees=True)
    assert graphed == eager
    assert {u[2] for u in used} == {"greedy", "filtered"}


@pytest.mark.parametrize("spec", ["none", "dflash"])
def test_unfiltered_sampled_batches_replay_their_own_graphs(qwen3_dir, drafter, spec, caplog):
    """A sampled batch that no row filters (T > 0, top_p 1, no top_k or min_p) replays the graphs
    captured without the filters' sort, and commits what the eager step (which skips the sort
    too) commits."""
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 8, caplog, reqs=requests(top_p=1.0))
    assert graphed == eager
    assert {v for _, _, v in used} == {"greedy", "sampled"} and SAMPLING_VARIANTS == ("greedy", "sampled", "filtered")


@pytest.mark.parametrize("spec, sampled_trees", [("ngram", False), ("dflash", False), ("ddtree", False),
                                                 ("dflash", True)])
def test_adaptive_width_graphs_equal_eager(qwen3_dir, drafter, spec, sampled_trees, caplog, monkeypatch):
    """Graphs captured per verify width (the adaptive policy's widths) replay exactly what the
    eager step computes at that width, across widths changing every step."""
    cycling_widths(monkeypatch)
    extra = {"sampled_trees": True} if sampled_trees else {}
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 4, caplog, spec_policy="adaptive", **extra)
    assert graphed == eager
    assert {w for *_, w in used} == {1, 2, 4, {"ngram": 8, "dflash": 5, "ddtree": 7}[spec]}


def test_startup_replays_time_every_graph_and_change_no_output(qwen3_dir, drafter, caplog, monkeypatch):
    """The adaptive policy's priors: one time per (bucket, width, sampling variant) graph, replayed on
    the captured inputs before serving; the engine's outputs after them equal eager ones (the
    replays write page 0 and the carry only). On CUDA the engine does this when it starts."""
    cycling_widths(monkeypatch)
    reqs = requests()
    eager = run(engine_for(qwen3_dir, "dflash", drafter, graphs=False, spec_policy="adaptive"), reqs)
    engine = engine_for(qwen3_dir, "dflash", drafter, graphs=True, max_bs=4, spec_policy="adaptive")
    priors = engine.graphed.replay_seconds(reps=2)
    assert set(priors) == {(b, w, v) for b in (1, 2, 4) for w in (1, 2, 4, 5) for v in SAMPLING_VARIANTS}
    assert all(t > 0 for t in priors.values())
    engine.policy.cost.set_priors(priors)
    assert run(engine, reqs) == eager


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_padded_buckets_equal_eager(qwen3_dir, drafter, spec, caplog):
    eager, graphed, used = graphed_run(qwen3_dir, drafter, spec, 8, caplog)
    assert graphed == eager
    assert (7, 8, "filtered") in used                               # 7 rows padded to the bucket of 8


@pytest.mark.parametrize("spec", ["none", "dflash"])
def test_batches_with_penalties_or_logprobs_run_eagerly_and_say_so(qwen3_dir, drafter, spec, caplog):
    """The graphs carry no penalty, bias or logprob state: a batch that needs any skips them
    (logged once per reason) and equals the eager engine; batches without them still replay."""
    reqs = requests(4)
    reqs[1] = (reqs[1][0], reqs[1][1], SamplingParams(temperature=0.9, seed=3, max_tokens=6, ignore_eos=True,
                                                      presence_penalty=1.0, logit_bias={3: 2.0}))
    reqs[2] = (reqs[2][0], reqs[2][1], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2))
    eager = run(engine_for(qwen3_dir, spec, drafter, graphs=False), reqs)
    engine = engine_for(qwen3_dir, spec, drafter, graphs=True)
    graphed_fn = engine.graphed.at(engine.spec_step.full_width)

    def check(inputs):
        assert inputs.needs_eager is None
    spy = engine.graphed = GraphSpy(engine.graphed, check)
    used = spy.used
    with caplog.at_level(logging.INFO, logger="blockspec.cuda_graphs"):
        assert run(engine, reqs) == eager
    messages = [r.message for r in caplog.records if "runs eagerly" in r.message]
    assert any("PenaltyProcessor" in m for m in messages) and any("logprobs" in m for m in messages)
    assert len(messages) == len(set(messages))
    assert used  # the tail of the batch (the long greedy request alone) replays the graphs again
    with pytest.raises(ValueError, match="logprobs"):  # called directly, a graph refuses such a step
        graphed_fn(type("S", (), {"batch_size": 1, "packed": object(), "needs_eager": "logprobs"})(), None)
