"""Per-request traces of accepted drafts, step by step, at the full width (static policy): the
input of `blockspec/bench/policy_sim.py`, which replays the adaptive policy on them at a GPU's step costs.

A step at the full width observes every narrower width exactly (`engine/acceptance.py`:
a chain of width w would have accepted min(a, w − 1) of the a drafts accepted at the full
width), so one static run gives what any sequence of widths would have accepted.

    OMP_NUM_THREADS=1 python bench/accept_traces.py --temperature 1 --output bench/results/policy_sim/traces_t1.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockspec.bench.compare import run_concurrency  # noqa: E402
from bundled_workload import bundled_dflash, sharegpt_requests  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    llm = bundled_dflash(device="cpu", dtype="float32", max_running_requests=args.concurrency, spec_policy="static")
    ids, params = sharegpt_requests(llm, args.prompts, args.max_tokens, args.temperature)
    policy, traces = llm.engine.policy, {}
    real = policy.observe

    def observe(seqs, width, step, *a, **kw):
        for seq, accepted in zip(seqs, step.accepted):
            traces.setdefault(seq.request_id, []).append(accepted)
        return real(seqs, width, step, *a, **kw)
    policy.observe = observe
    run_concurrency(llm, ids, params, args.concurrency)
    doc = {"command": "python " + " ".join(sys.argv), "temperature": args.temperature,
           "full_width": policy.full_width, "traces": list(traces.values())}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(doc))
    steps = sum(map(len, doc["traces"]))
    print(f"{len(doc['traces'])} requests, {steps} steps, accept length {1 + sum(map(sum, doc['traces'])) / steps:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
