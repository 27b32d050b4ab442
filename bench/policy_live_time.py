"""The adaptive policy's host time per step inside a real engine run (issue 15: < 2 % of the step):
`SpecPolicy.choose` and `observe` wrapped with a clock while the bundled pair serves `bench
offline --compare-static`'s workload at one concurrency. `bench/policy_host_time.py` drives the
policy alone in a loop, where its code and data stay in the CPU's caches; between a real
engine's tensor ops they do not, and the same calls took 5–10× as long on the 2-core CPU.

    OMP_NUM_THREADS=1 python bench/policy_live_time.py [--concurrency 1] [--temperature 1] [--split]

`--split`: also the time of the pieces of a full choice and of an observe (µs a call).
`--pin-width W`: every step at width W (the choice itself not run: on this CPU the policy runs
plain where on a GPU it speculates), so that `observe` learns from real speculative steps.
`--scalar-rows N`: the acceptance model's per-row path up to N rows (numpy's above).
`--spec-quiet-steps N`: the policy's quiet stretches after a speculative choice (SPEC_QUIET_STEPS).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockspec.bench.compare import run_concurrency  # noqa: E402
from bundled_workload import bundled_dflash, sharegpt_requests  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--split", action="store_true")
    ap.add_argument("--pin-width", type=int, default=None)
    ap.add_argument("--scalar-rows", type=int, default=None)
    ap.add_argument("--spec-quiet-steps", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    llm = bundled_dflash(device=args.device, dtype=args.dtype, max_running_requests=args.concurrency)
    ids, params = sharegpt_requests(llm, args.prompts, args.max_tokens, args.temperature)
    run_concurrency(llm, ids[:args.concurrency], params[:args.concurrency], args.concurrency)   # warm
    policy, samples = llm.engine.policy, {"choose": [], "observe": []}
    if args.pin_width is not None:
        policy._choose_quietly, policy._choose = (lambda ids: None), (lambda seqs, ids: args.pin_width)
    if args.scalar_rows is not None:
        policy.acceptance.scalar_rows = args.scalar_rows
    if args.spec_quiet_steps is not None:
        policy.spec_quiet_steps = args.spec_quiet_steps
    pieces = [(policy, "_choose"), (policy.acceptance, "expected_totals"), (policy, "_costs_or_width_to_time"),
              (policy, "_charged"), (policy.acceptance, "observe_step"), (policy.cost, "observe")] if args.split else []
    for owner, name in pieces:
        samples[name] = []
    owners = dict([(name, owner) for owner, name in pieces], choose=policy, observe=policy)
    for name, seconds in samples.items():
        real = getattr(owners[name], name)

        def timed(*a, _real=real, _seconds=seconds, **kw):
            start = time.perf_counter()
            try:
                return _real(*a, **kw)
            finally:
                _seconds.append(time.perf_counter() - start)
        setattr(owners[name], name, timed)
    record = run_concurrency(llm, ids, params, args.concurrency)
    steps = len(samples["choose"])
    doc = {"args": vars(args), "tok_s": round(record["tok_s"], 1), "steps": steps,
           "step_ms": round(record["seconds"] / max(1, steps) * 1e3, 3)}
    for name, seconds in samples.items():
        if not seconds:
            continue
        s = sorted(seconds)
        doc[name + "_us"] = {"calls": len(s), "mean": round(sum(s) / len(s) * 1e6, 1),
                             "p50": round(s[len(s) // 2] * 1e6, 1), "p90": round(s[int(len(s) * 0.9)] * 1e6, 1)}
    per_step = (sum(samples["choose"]) + sum(samples["observe"])) / max(1, steps)
    doc["policy_us_per_step"] = round(per_step * 1e6, 1)
    doc["share_of_step"] = round(per_step / (record["seconds"] / max(1, steps)), 4)
    # What the policy chose and the costs it chose from (why a width won: the T = 0 runs on the
    # H100 chose chains 4 and 8 for half their steps where the static chain 16 was faster).
    doc["choices"] = dict(policy.choices)
    doc["cost_tables"] = [policy.cost.format_table(b) for b in policy.cost.buckets
                          if any(t is not None for t in policy.cost.table(b).values())]
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
