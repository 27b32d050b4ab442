"""Engines with graphed decode steps (static buffers on CPU, CUDA graphs on a GPU) and the
request mix their tests run: greedy and seeded sampled rows that finish at different steps."""

from __future__ import annotations

import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams, variant_of

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run(engine, requests):
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    got = {rid: [] for rid, _, _ in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    return got


def requests(n=7, top_p=0.9):
    """`n` requests, greedy and seeded sampled (at `top_p`) in turn."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        prompt = torch.randint(0, 400, (3 + 2 * i,), generator=gen).tolist()
        # The last (greedy) request outlives the others: its steps run as an all-greedy batch.
        n_tokens = 4 + 2 * i if i < n - 1 else 40
        params = (SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True) if i % 2 == 0 else
                  SamplingParams(temperature=0.9, top_p=top_p, seed=100 + i, max_tokens=n_tokens, ignore_eos=True))
        out.append((f"r{i}", prompt, params))
    return out


def engine_for(model, spec, drafter, graphs: bool, max_bs: int = 4, backend: str = "reference",
               overlap: bool = False, **settings):
    """`overlap`: overlapped decoding (engine/overlap.py), which on CPU runs on the static buffers too.
    The speculation policy is static unless `spec_policy` is given: an adaptive width depends on
    timings, which differ between the two engines a test compares (`cycling_widths` pins them)."""
    settings.setdefault("spec_policy", "static")
    cfg = EngineConfig(model=model, device=DEVICE, spec=spec, draft_model=drafter if spec in ("dflash", "ddtree") else None,
                       tree_budget=6 if spec == "ddtree" else None, cuda_graph=graphs, cuda_graph_max_bs=max_bs,
                       attention_backend=backend, overlap_schedule=overlap, **settings)
    engine = Engine(cfg)
    if graphs and engine.graphed is None:        # CPU: no graphs by default; use the static buffers
        engine.graphed = engine.capture_graphs()
        if overlap:
            engine.overlap, engine.scheduler.steps_ahead = True, 1
            if engine.policy is not None:
                engine.policy.overlapped = True
    assert engine.overlap == (overlap and graphs and engine.spec_step.drafts_on_device)
    return engine


def cycling_widths(monkeypatch) -> None:
    """Adaptive engines whose width changes every step, from a step count (the same in every
    engine): graphs of every width run, and eager and graphed engines stay comparable."""
    from blockspec.engine.spec_policy import SpecPolicy

    def choose(self, seqs):
        self._k = getattr(self, "_k", -1) + 1
        return self.widths[(self._k * 3) % len(self.widths)]
    monkeypatch.setattr(SpecPolicy, "choose", choose)


class GraphSpy:
    """Stands in for an engine's `WidthGraphs`, recording (batch, bucket, sampling variant, width) of
    every graphed step and checking that padding rows point at page 0 only."""

    def __init__(self, graphs, check=None):
        self.graphs, self.used, self.check = graphs, [], check
        self.can_run, self.pool = graphs.can_run, graphs.pool

    def at(self, width):
        graphed_fn = self.graphs.at(width)

        def spy(inputs, tree):
            if self.check is not None:
                self.check(inputs)
            B, bucket = inputs.batch_size, graphed_fn.bucket_for(inputs.batch_size)
            out = graphed_fn(inputs, tree)
            # Padding rows (a batch of 3 in the bucket of 4) point at page 0 only: never a live page.
            variant = variant_of(inputs.all_greedy, inputs.sampling.filters)
            assert graphed_fn.static[bucket, variant].packed.page_table[B:].eq(0).all()
            self.used.append((B, bucket, variant, width))
            return out
        spy.can_run = graphed_fn.can_run
        return spy
