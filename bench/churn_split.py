"""Where a churning run's time goes, by engine function (issue 15): `bench offline --compare-static`'s
workload (held-out ShareGPT prompts, 128 tokens, at most c in flight, a request added as one
finishes) through the plain engine, the speculative engine held at static chain 4, and the adaptive
one, with host_split.py's wall-clock wrappers on the engine's functions — the prefill (and the
drafter's share of it), the decode step's launch and commit, the drafter-context flush, the policy.

On the H100 at c = 64, T = 1 the adaptive engine's steps were timed at 1.3 ms where its run spent
≈ 3.9 ms per step, against 1.5 and 2.0 ms for the plain engine: this splits the rest.

    python bench/churn_split.py --device cuda --dtype bfloat16 --concurrency 64 --output /tmp/churn.json
    python bench/churn_split.py --prompts 4 --concurrency 2 --max-tokens 8          (CPU smoke)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockspec.bench.compare import run_concurrency  # noqa: E402
from blockspec.bench.datasets import load_dataset  # noqa: E402
from blockspec.bench.offline import prompt_token_ids  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402
from host_split import instrument, unwrap, wrap, write_rows  # noqa: E402
from steady_steps import BUNDLED  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request runs to --max-tokens (its plain requests then finish in lockstep); "
                         "default: as `bench offline`, a request may stop at EOS")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    common = dict(device=args.device, dtype=args.dtype, max_running_requests=args.concurrency)
    spec = dict(spec="dflash", draft_model=str(BUNDLED / "drafter"), **common)
    llms = {"plain": LLM(str(BUNDLED / "target"), **common),
            "chain4": LLM(str(BUNDLED / "target"), block_size=4, spec_policy="static", **spec),
            "adaptive": LLM(str(BUNDLED / "target"), spec_policy="adaptive", **spec)}
    tokenizer = llms["plain"].tokenizer
    prompts = load_dataset("sharegpt", args.prompts, 0)
    limit = llms["plain"].engine.max_model_len - args.max_tokens - 32
    ids = [prompt_token_ids(p, tokenizer, limit) for p in prompts]
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                             ignore_eos=args.ignore_eos)] * len(ids)
    rows = []
    for label, llm in llms.items():
        engine = llm.engine
        run_concurrency(llm, ids[:args.concurrency], params, args.concurrency)      # warm: every bucket once
        acc = defaultdict(float)
        counts = defaultdict(int)
        decode, prefill = engine._decode_step, engine._prefill_step
        engine._decode_step = lambda seqs, f=decode: (counts.__setitem__("decode", counts["decode"] + 1), f(seqs))[1]
        engine._prefill_step = lambda seqs, n, f=prefill: (counts.__setitem__("prefill", counts["prefill"] + 1),
                                                           f(seqs, n))[1]
        instrument(engine, acc)
        wrap(engine, "_prefill_step", "engine._prefill_step", acc)
        if engine.proposer is not None:
            wrap(engine.proposer, "on_prefill", "proposer.on_prefill", acc)
        if engine.graphed_prefill is not None:
            wrap(engine, "graphed_prefill", "engine.graphed_prefill", acc)
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        record = run_concurrency(llm, ids, params, args.concurrency)
        seconds = time.perf_counter() - start
        unwrap()
        del engine._decode_step, engine._prefill_step
        row = {"engine": label, "seconds": round(seconds, 4), "tok_s": round(record["tok_s"], 1),
               "accept_length": round(record["accept_length"], 3), "configurations": record["configurations"],
               "calls": dict(counts), "ms_per_decode_call": round(seconds / max(counts["decode"], 1) * 1e3, 4),
               "split_ms": {k: round(v * 1e3, 2) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}}
        if engine.policy is not None:
            row["cost_table_ms"] = {b: {w: None if t is None else round(t * 1e3, 4) for w, t in engine.policy.cost.table(b).items()}
                                    for b in engine.policy.cost.buckets}
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
