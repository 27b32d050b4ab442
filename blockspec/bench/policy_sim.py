"""The adaptive policy replayed against recorded acceptance and a given step-cost table: tok/s of
adaptive, plain and each static width, without running a model (issue 15's GPU regime studied on
a CPU: which width the policy picks when speculation barely pays or barely loses).

Acceptance comes from traces of full-width steps (`bench/accept_traces.py`): per request, the
drafts each step accepted. They are read as runs of predictable text: the full-width step that
began at position s and accepted a drafts says the positions s … s + a were drafted right from
s. A simulated step beginning at p inside that run (s ≤ p ≤ s + a) accepts min(s + a − p, w − 1)
at width w; one at s + a + 1 begins the trace's next step. Plain steps commit one token. This
keeps what matters to the policy — requests differ, and a request's acceptance comes in
stretches — and ignores that a drafter re-drafting from p may do better than the run says.

Time: each step costs `costs[bucket][w]` seconds (the bucket of its batch size) times a
log-normal factor (`noise`), a drafting step after plain steps first pays `flush` seconds (the
deferred drafter-context write, `proposers.DeferredContext`), and each request's prefill costs
`prefill` seconds and interrupts the step timing, as in the engine.

    python -m blockspec.bench.policy_sim --traces bench/results/policy_sim/traces_t1.json \\
        --costs '{"1": {"1": 0.41e-3, "2": 0.74e-3, "4": 0.77e-3, "8": 0.81e-3, "16": 0.85e-3}}' --concurrency 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
from bisect import bisect_left
from collections import Counter
from pathlib import Path

from blockspec.engine.sequence import Status
from blockspec.engine.spec_policy import SpecPolicy
from blockspec.sampling import SamplingParams
from blockspec.speculative.step import StepResult


class _Row:
    """A simulated request: its trace as runs, the position reached, tokens left."""

    def __init__(self, request_id: str, trace: list[int], max_tokens: int, params: SamplingParams):
        self.request_id, self.params, self.status = request_id, params, Status.RUNNING
        self.ends, p = [], 0          # ends[k]: the last position the k-th run drafted right
        for a in trace:
            self.ends.append(p + a)
            p += a + 1
        self.span, self.pos, self.left = p, 0, max_tokens

    def accepts(self, width: int) -> int:
        """Drafts a step at `width` beginning at the current position accepts."""
        p = self.pos % self.span       # past the trace's end it repeats
        end = self.ends[bisect_left(self.ends, p)]       # (ends grow along the trace)
        return min(end - p, width - 1, self.left - 1)


def simulate(traces: list[list[int]], costs: dict[int, dict[int, float]], concurrency: int,
             policy: str | int = "adaptive", max_tokens: int = 128, temperature: float = 1.0,
             noise: float = 0.05, flush: float = 0.0, prefill: float = 0.0, per_token: float = 0.0,
             seed: int = 0, configure=None, overlap: bool = False) -> dict:
    """Run every trace once as a request, at most `concurrency` at a time. `policy`: "adaptive"
    (a `SpecPolicy` over the widths of `costs`, passed to `configure` first if given) or a
    fixed width. `per_token`: seconds a committed token adds to its step (the host's commit:
    on the H100 the bundled pair's steps at 16 rows cost ≈ 13 µs a token more). `overlap`: as
    the engine's overlapped schedule (CUDA graphs), each step is chosen before the previous
    one is observed, which is observed with the next one's width; a prefill drains. Returns
    tok/s and steps per width."""
    rng = random.Random(seed)
    buckets = sorted(costs)
    widths = sorted(costs[buckets[0]])
    full = max(widths)
    spec = SpecPolicy("adaptive", full, False, buckets) if policy == "adaptive" else None
    if spec is not None:
        if configure is not None:
            configure(spec)
        pending = [False]
        spec.context_pending = lambda: pending[0]
        spec.overlapped = overlap
    in_flight = None          # (rows, width, step, time) chosen and run, not yet observed
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    queue = [_Row(f"r{i}", t, max_tokens, params) for i, t in enumerate(traces) if t]
    queue.reverse()
    live, clock, tokens, ran = [], 0.0, 0, Counter()
    while queue or live:
        while queue and len(live) < concurrency:
            if in_flight is not None:                 # a drain: observed with nothing launched after it
                spec.interrupt()
                spec.observe(*in_flight[:3], now=in_flight[3], next_width=None)
                in_flight = None
            live.append(queue.pop())
            clock += prefill
            if spec is not None:
                spec.interrupt()
        B = len(live)
        bucket = next(b for b in buckets if b >= B)
        width = spec.choose(live) if spec is not None else int(policy)
        if spec is not None and width > 1 and pending[0]:
            clock += flush
            spec.observe_flush(flush)
            pending[0] = False
        accepted = [row.accepts(width) for row in live]
        clock += (costs[bucket][width] + per_token * (sum(accepted) + B)) * math.exp(rng.gauss(0.0, noise))
        ran[width] += 1
        for row, a in zip(live, accepted):
            row.pos += a + 1
            row.left -= a + 1
            tokens += a + 1
            if row.left <= 0:
                row.status = Status.FINISHED
        if spec is not None:
            if width == 1:
                pending[0] = True
            step = StepResult([[0] * (a + 1) for a in accepted], accepted, [width - 1] * B,
                              [list(range(1, a + 1)) for a in accepted])
            if overlap:
                if in_flight is not None:
                    spec.observe(*in_flight[:3], now=in_flight[3], next_width=width)
                in_flight = (list(live), width, step, clock)
            else:
                spec.observe(live, width, step, now=clock)
            for row in live:
                if row.status is Status.FINISHED:
                    spec.forget(row.request_id)
        live = [row for row in live if row.status is not Status.FINISHED]
    return {"policy": policy, "concurrency": concurrency, "tok_s": tokens / clock, "tokens": tokens,
            "seconds": clock, "steps": dict(sorted(ran.items()))}


def compare(traces, costs, concurrency: int, seeds: int = 3, **kw) -> dict:
    """Adaptive, plain and every static width (mean tok/s over `seeds` noise seeds), and
    adaptive ÷ plain and ÷ the best static width."""
    widths = sorted(costs[min(costs)])
    runs = {}
    for policy in ["adaptive", *widths]:
        results = [simulate(traces, costs, concurrency, policy, seed=s, **kw) for s in range(seeds)]
        runs[str(policy)] = {"tok_s": sum(r["tok_s"] for r in results) / seeds,
                             "steps": results[0]["steps"]}
    best = max(runs[str(w)]["tok_s"] for w in widths)
    adaptive = runs["adaptive"]["tok_s"]
    return {"concurrency": concurrency, "runs": runs, "adaptive_vs_plain": adaptive / runs["1"]["tok_s"],
            "adaptive_vs_best_static": adaptive / best}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True, help="bench/accept_traces.py's JSON")
    ap.add_argument("--costs", required=True, help='JSON {bucket: {width: seconds}}')
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1])
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--flush", type=float, default=0.0)
    ap.add_argument("--prefill", type=float, default=0.0)
    ap.add_argument("--per-token", type=float, default=0.0)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    doc = json.loads(Path(args.traces).read_text())
    costs = {int(b): {int(w): float(s) for w, s in row.items()} for b, row in json.loads(args.costs).items()}
    for c in args.concurrency:
        out = compare(doc["traces"], costs, c, args.seeds, temperature=doc["temperature"], noise=args.noise,
                      flush=args.flush, prefill=args.prefill, per_token=args.per_token, overlap=args.overlap)
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
