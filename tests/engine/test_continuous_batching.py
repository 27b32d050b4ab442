"""Continuous batching on the real engine (tiny Qwen3): requests join and leave between steps,
run with speculation, survive preemption and chunked prefill, and every greedy request's
output is exactly what it produces when it runs alone."""

from __future__ import annotations

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams
from blockspec.speculative.proposers import Proposer
from blockspec.speculative.tree import chain_tree
from dflash_fixtures import write_dflash_drafter

VOCAB = 512
NUM_ORDINARY = VOCAB - 4  # the four special tokens come last


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def seeded(max_tokens: int, seed: int) -> SamplingParams:
    """Sampling from the request's own generator: batch-independent too, and unlike this tiny
    model's greedy output (which mostly repeats one token) far from repetitive."""
    return SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def params_for(max_tokens: int, seed: int | None) -> SamplingParams:
    return greedy(max_tokens) if seed is None else seeded(max_tokens, seed)


def prompt(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, NUM_ORDINARY, (length,), generator=gen).tolist()


@pytest.fixture(scope="module")
def drafter_dir(qwen3_dir, tmp_path_factory) -> str:
    return str(write_dflash_drafter(tmp_path_factory.mktemp("cb_drafter"), qwen3_dir, block_size=8))


@pytest.fixture(scope="module")
def alone(qwen3_dir, drafter_dir):
    """alone(prompt, max_tokens, seed=None, spec="none") -> token ids of that request run by
    itself. A greedy request is compared with plain greedy decoding whatever the spec (greedy
    speculation is lossless); a seeded one with the same speculative setup run alone."""
    engines: dict[str, Engine] = {}
    cache: dict = {}

    def run(ids: list[int], max_tokens: int, seed: int | None = None, spec: str = "none") -> list[int]:
        spec = "none" if seed is None else spec
        key = (tuple(ids), max_tokens, seed, spec)
        if key not in cache:
            if spec not in engines:
                engines[spec] = make_engine(qwen3_dir, drafter_dir, spec, max_running_requests=1)
            engine = engines[spec]
            engine.add_request("alone", ids, params_for(max_tokens, seed))
            out = []
            for _ in range(max_tokens + 5):
                for o in engine.step():
                    out += o.new_token_ids
                if not engine.has_unfinished_requests():
                    break
            assert not engine.has_unfinished_requests() and len(out) == max_tokens
            cache[key] = out
        return cache[key]
    return run


def make_engine(qwen3_dir, drafter_dir=None, spec="none", **overrides) -> Engine:
    cfg = dict(model=qwen3_dir, spec=spec, max_running_requests=8)
    if spec == "dflash":
        cfg.update(draft_model=drafter_dir, block_size=4)
    elif spec == "ngram":
        cfg.update(block_size=4)
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg))


class Run:
    """Drives an engine, adding requests before given steps; records every step's outputs."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, str] = {}
        self.steps: list[dict[str, int]] = []  # per step: request id -> tokens committed
        self.seqs = {}

    def add(self, rid: str, ids: list[int], max_tokens: int, seed: int | None = None) -> None:
        self.engine.add_request(rid, ids, params_for(max_tokens, seed))
        self.tokens[rid] = []
        self.seqs[rid] = self.engine._requests[rid].seq

    def step(self) -> dict[str, int]:
        committed = {}
        for o in self.engine.step():
            assert o.request_id not in self.finish, "output after the request finished"
            self.tokens[o.request_id] += o.new_token_ids
            committed[o.request_id] = len(o.new_token_ids)
            assert o.num_output_tokens == len(self.tokens[o.request_id])
            if o.finished:
                self.finish[o.request_id] = o.finish_reason
        self.steps.append(committed)
        self.check_pages()
        return committed

    def check_pages(self) -> None:
        engine = self.engine
        held = sum(len(s.page_table.pages) for s in engine.scheduler.running + list(engine.scheduler.waiting))
        assert engine.allocator.num_used_pages == held, "K/V pages leaked"

    def until_done(self, max_steps: int = 400) -> None:
        for _ in range(max_steps):
            if not self.engine.has_unfinished_requests():
                break
            self.step()
        assert not self.engine.has_unfinished_requests(), "requests still unfinished (hang)"
        assert self.engine.stats().kv_tokens_used == 0 and self.engine.allocator.num_used_pages == 0
        assert not self.engine.scheduler.running and not self.engine.scheduler.waiting


# ---- joining between steps --------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", "ngram", "dflash"])
def test_requests_added_between_steps_join_the_running_batch(qwen3_dir, drafter_dir, alone, spec):
    run = Run(make_engine(qwen3_dir, drafter_dir, spec))
    reqs = {"a": (prompt(9, 1), 14, None), "b": (prompt(23, 2), 8, None), "c": (prompt(4, 3), 10, 3),
            "d": (prompt(15, 4), 6, None)}
    run.add("a", *reqs["a"])
    run.step(), run.step()
    assert run.tokens["a"] and len(run.engine.scheduler.running) == 1
    run.add("b", *reqs["b"])
    run.add("c", *reqs["c"])
    prefilled = run.step()  # b and c are admitted and prefilled together (a waits one step)
    assert set(prefilled) == {"b", "c"}, run.steps
    joined = run.step()  # ... and now decode in the same step as a
    assert set(joined) == {"a", "b", "c"}, run.steps
    run.add("d", *reqs["d"])
    run.until_done()
    assert any({"a", "d"} <= set(s) for s in run.steps), "the late request never shared a step"
    for rid, (ids, n, seed) in reqs.items():
        assert run.tokens[rid] == alone(ids, n, seed, spec), rid
        assert run.finish[rid] == "length"
    if spec != "none":
        assert all(run.seqs[r].metrics.verify_steps > 0 for r in reqs)
        for committed in run.steps:
            assert all(1 <= k <= run.engine.lookahead for k in committed.values())


class PartialOracle(Proposer):
    """Drafts each request's true greedy continuation, but only its first `right[rid]` draft
    tokens are right (the next one is wrong), so every verify step of that request commits
    exactly right + 1 tokens, whatever else is in the batch."""


    def __init__(self, truth: dict[tuple, list[int]], right: dict[tuple, int], num_draft: int):
        self.truth, self.right = truth, right
        self.max_depth = self.max_nodes = num_draft


    def propose(self, seqs, inputs, width=None):
        roots = inputs.roots
        rows = []
        for s in seqs:
            key = tuple(s.prompt_ids)
            cont = self.truth[key] + [0] * self.max_nodes
            k = self.right[key]
            row = cont[s.num_output:s.num_output + self.max_nodes]
            row[k] = (row[k] + 1) % NUM_ORDINARY  # first wrong draft
            rows.append(row)
        return chain_tree(torch.tensor(rows), roots), None


def test_each_request_commits_its_own_number_of_tokens_per_step(qwen3_dir, alone):
    n = 20
    specs = [(prompt(8, 10), 0), (prompt(12, 11), 1), (prompt(5, 12), 3)]  # (prompt, right drafts)
    truth = {tuple(p): alone(p, n) for p, _ in specs}
    right = {tuple(p): k for p, k in specs}
    # Static: the test counts each step's commits at the full width (adaptive widths follow timings).
    engine = Engine(EngineConfig(model=qwen3_dir, spec="dflash", spec_policy="static"), proposer=PartialOracle(truth, right, 4))
    run = Run(engine)
    for i, (p, _) in enumerate(specs):
        run.add(f"r{i}", p, n)
    run.until_done()
    assert run.steps[0] == {"r0": 1, "r1": 1, "r2": 1}  # the prefill step samples one token each
    # One batch step, three different commit counts.
    assert run.steps[1] == {"r0": 1, "r1": 2, "r2": 4}, run.steps
    for i, (p, k) in enumerate(specs):
        rid = f"r{i}"
        assert run.tokens[rid] == truth[tuple(p)]
        per_step = [s[rid] for s in run.steps[1:] if rid in s]
        full, rest = divmod(n - 1, k + 1)
        assert per_step == [k + 1] * full + ([rest] if rest else []), (rid, per_step)
        m = run.seqs[rid].metrics
        assert m.verify_steps == len(per_step)
        assert m.accepted_tokens == k * m.verify_steps


# ---- preemption -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", "dflash"])
def test_tiny_kv_pool_preempts_and_every_request_still_matches_alone(qwen3_dir, drafter_dir, alone, spec):
    shapes = [(18, 10, None), (7, 12, None), (13, 9, 5), (3, 11, None), (10, 10, 6)]  # (prompt, max_tokens, seed)
    reqs = {f"r{i}": (prompt(length, 20 + i), n, seed) for i, (length, n, seed) in enumerate(shapes)}
    lookahead = 4 if spec == "dflash" else 1
    need = max(len(p) + n for p, n, _ in reqs.values()) + lookahead  # one request's worst case
    kv_tokens = -(-need // 4) * 4 + 4                                   # just above it, page 4
    run = Run(make_engine(qwen3_dir, drafter_dir, spec, kv_cache_tokens=kv_tokens, page_size=4))
    assert run.engine.lookahead == lookahead
    for rid, (p, n, seed) in reqs.items():
        run.add(rid, p, n, seed)
    run.until_done()
    assert sum(s.num_preemptions for s in run.seqs.values()) > 0, "the pool never ran out: sizes are wrong"
    for rid, (p, n, seed) in reqs.items():
        assert run.finish[rid] == "length"
        assert run.tokens[rid] == alone(p, n, seed, spec), rid


# ---- chunked prefill --------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", "dflash"])
def test_chunked_prefill_equals_unchunked_and_decodes_interleave(qwen3_dir, drafter_dir, alone, spec):
    long_prompt, short_prompt, sampled_prompt = prompt(120, 30), prompt(6, 31), prompt(50, 32)
    run = Run(make_engine(qwen3_dir, drafter_dir, spec, max_prefill_tokens=16))
    run.add("short", short_prompt, 16)
    run.step(), run.step()
    run.add("long", long_prompt, 6)
    run.add("sampled", sampled_prompt, 8, seed=9)
    long_seq = run.seqs["long"]
    chunk_steps, short_during = 0, 0
    while long_seq.num_output == 0:
        before = long_seq.num_cached
        committed = run.step()
        if long_seq.num_cached > before:
            chunk_steps += 1
            assert long_seq.num_cached - before <= 16
        short_during += "short" in committed
        assert len(run.steps) < 40
    assert chunk_steps == -(-120 // 16)
    assert short_during >= chunk_steps - 1, "the decoding request stalled during the chunked prefill"
    run.until_done()
    # alone = unchunked (the default prefill budget holds each prompt whole)
    assert run.tokens["long"] == alone(long_prompt, 6)
    assert run.tokens["short"] == alone(short_prompt, 16)
    assert run.tokens["sampled"] == alone(sampled_prompt, 8, 9, spec)


# ---- abort ------------------------------------------------------------------------------------

def test_abort_mid_decode_frees_its_pages(qwen3_dir, alone):
    run = Run(make_engine(qwen3_dir, page_size=4))
    keep, gone, waiting = prompt(10, 40), prompt(25, 41), prompt(9, 42)
    run.add("keep", keep, 12)
    run.add("gone", gone, 40)
    for _ in range(4):
        run.step()
    gone_seq = run.seqs["gone"]
    assert gone_seq.num_output > 1 and gone_seq.page_table.pages
    used = run.engine.allocator.num_used_pages
    run.engine.abort_request("gone")
    assert gone_seq.page_table.pages == [] and gone_seq.finish_reason == "abort"
    assert run.engine.allocator.num_used_pages == used - (-(-(25 + gone_seq.num_output - 1) // 4))
    assert "gone" not in run.engine._requests
    run.add("waiting", waiting, 5)
    run.engine.abort_request("waiting")  # before it ever ran
    run.engine.abort_request("no-such-request")  # ignored
    run.until_done()
    assert "gone" not in run.finish and "waiting" not in run.finish
    assert run.tokens["keep"] == alone(keep, 12)
