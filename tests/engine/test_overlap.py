"""Overlapped decoding (engine/overlap.py) commits exactly what the synchronous engine commits.

Step N+1 is launched with each row's prefix and root computed on the device from step N, before
the host reads step N; rows whose request finished meanwhile are wasted and dropped. These tests
run the overlapped engine beside the synchronous one (on CPU over the graphs' static buffers, on
a GPU with real graphs) for greedy and seeded sampled rows that finish at different steps, with
arrivals and an abort mid-run, and check that no page is left allocated.
"""

from __future__ import annotations

import pytest

import blockspec.engine.engine as engine_module
from blockspec.sampling import SamplingParams
from graph_fixtures import engine_for, requests, run


def launches(monkeypatch):
    """Count overlapped launches, and those made while another step was in flight."""
    seen = {"launched": 0, "over_previous": 0}
    real = engine_module.launch_decode

    def spy(graphed, seqs, uniforms, previous):
        seen["launched"] += 1
        seen["over_previous"] += previous is not None
        return real(graphed, seqs, uniforms, previous)

    monkeypatch.setattr(engine_module, "launch_decode", spy)
    return seen


@pytest.mark.parametrize("spec", ["none", "dflash", "ddtree"])
def test_overlapped_equals_synchronous(qwen3_dir, drafter, spec, monkeypatch):
    reqs = requests()
    expected = run(engine_for(qwen3_dir, spec, drafter, graphs=True, max_bs=8), reqs)
    engine = engine_for(qwen3_dir, spec, drafter, graphs=True, max_bs=8, overlap=True)
    seen = launches(monkeypatch)
    assert run(engine, reqs) == expected
    assert seen["over_previous"] >= 30                 # the long request's steps overlapped
    assert engine.allocator.num_used_pages == 0 and engine.in_flight is None


def test_arrivals_and_abort_while_a_step_is_in_flight(qwen3_dir, drafter, monkeypatch):
    """Requests arriving mid-run drain the step in flight (their prefill changes the batch);
    an aborted request's in-flight row is dropped; the others are unaffected."""
    first, later = requests(4), requests(7)[4:]

    def drive(engine):
        for rid, prompt, params in first:
            engine.add_request(rid, prompt, params)
        got, steps = {}, 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                got.setdefault(out.request_id, []).extend(out.new_token_ids)
            steps += 1
            if steps == 3:
                for rid, prompt, params in later:
                    engine.add_request(rid, prompt, params)
            if steps == 8:
                engine.abort_request("r6")
        return got

    sync = engine_for(qwen3_dir, "dflash", drafter, graphs=True, max_bs=8)
    overlapped = engine_for(qwen3_dir, "dflash", drafter, graphs=True, max_bs=8, overlap=True)
    seen = launches(monkeypatch)
    expected, got = drive(sync), drive(overlapped)
    assert seen["over_previous"] > 0
    for rid in ("r0", "r1", "r2", "r3", "r4", "r5"):
        assert got[rid] == expected[rid], rid
    # r6 was aborted: it produced a prefix of its full output, never more.
    full = run(engine_for(qwen3_dir, "dflash", drafter, graphs=True, max_bs=8), [requests(7)[6]])["r6"]
    assert got.get("r6", []) == full[:len(got.get("r6", []))] and len(got.get("r6", [])) < len(full)
    assert overlapped.allocator.num_used_pages == 0 and overlapped.in_flight is None


def test_stop_tokens_end_rows_inside_an_overlapped_batch(qwen3_dir, drafter):
    """A row that stops on a token (not on max_tokens) finishes while its next step is in flight."""
    probe = run(engine_for(qwen3_dir, "none", drafter, graphs=True), [("p", [3, 1, 4, 1, 5], SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True))])["p"]
    stop = probe[5]
    reqs = [("s", [3, 1, 4, 1, 5], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop], ignore_eos=True))]
    reqs += requests(3)
    expected = run(engine_for(qwen3_dir, "dflash", drafter, graphs=True), reqs)
    engine = engine_for(qwen3_dir, "dflash", drafter, graphs=True, overlap=True)
    assert run(engine, reqs) == expected
    assert expected["s"][-1] == stop and len(expected["s"]) <= 6
    assert engine.allocator.num_used_pages == 0


def test_a_drained_step_is_not_timed(qwen3_dir, drafter, monkeypatch):
    """A drain (the batch changes: the step in flight is read before anything is launched) commits
    a step launched before the previous commit, so the interval since then is only the rest of its
    wait: it must not become a cost sample. A fake clock advances by 1 per step launched or run
    eagerly, so every honest sample is at least 1 and a drained one would be 0."""
    import types

    import blockspec.engine.spec_policy as spec_policy
    clock = [0.0]
    monkeypatch.setattr(spec_policy, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_launch = engine_module.launch_decode

    def launch(*args):
        clock[0] += 1.0
        return real_launch(*args)
    monkeypatch.setattr(engine_module, "launch_decode", launch)
    engine = engine_for(qwen3_dir, "dflash", drafter, graphs=True, max_bs=8, overlap=True, spec_policy="adaptive")
    real_run = engine.spec_step.run

    def eager_run(*args, **kwargs):
        clock[0] += 1.0
        return real_run(*args, **kwargs)
    monkeypatch.setattr(engine.spec_step, "run", eager_run)
    samples = []
    real_observe = engine.policy.cost.observe
    monkeypatch.setattr(engine.policy.cost, "observe", lambda b, w, t: samples.append(t) or real_observe(b, w, t))
    first, later = requests(4), requests(7)[4:]
    for rid, prompt, params in first:
        engine.add_request(rid, prompt, params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 3:                  # arrivals mid-run: the step in flight is drained
            for rid, prompt, params in later:
                engine.add_request(rid, prompt, params)
    assert samples and min(samples) >= 1.0, samples
