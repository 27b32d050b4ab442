"""A/B of the adaptive policy's quiet plain stretches on one engine (issue 15): `bench offline
--compare-static`'s workload at one concurrency (T = 1, 32 held-out ShareGPT prompts, 64 tokens),
rounds alternating quiet stretches on (QUIET_STEPS = 8) and off (0) on the same adaptive engine,
beside a plain engine; tok/s per round.

    OMP_NUM_THREADS=1 python bench/quiet_ab.py [--concurrency 16] [--rounds 4]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import blockspec.engine.spec_policy as spec_policy  # noqa: E402
from blockspec.bench.compare import run_concurrency  # noqa: E402
from blockspec.bench.datasets import load_dataset  # noqa: E402
from blockspec.bench.offline import prompt_token_ids  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    common = dict(device=args.device, dtype=args.dtype, max_running_requests=args.concurrency)
    adaptive = LLM(str(BUNDLED / "target"), spec="dflash", draft_model=str(BUNDLED / "drafter"),
                   spec_policy="adaptive", **common)
    plain = LLM(str(BUNDLED / "target"), **common)
    ids = [prompt_token_ids(p, adaptive.tokenizer, adaptive.engine.max_model_len - 64 - 32)
           for p in load_dataset("sharegpt", 32, 0)]
    params = [SamplingParams(temperature=1.0, max_tokens=64)] * len(ids)
    for llm in (adaptive, plain):                  # warm: every bucket once
        run_concurrency(llm, ids[:args.concurrency], params, args.concurrency)
    tok_s = {"quiet": [], "full": [], "plain": []}
    for _ in range(args.rounds):
        for name in tok_s:
            spec_policy.QUIET_STEPS = 8 if name == "quiet" else 0
            record = run_concurrency(plain if name == "plain" else adaptive, ids, params, args.concurrency)
            tok_s[name].append(round(record["tok_s"], 1))
    print(json.dumps({"concurrency": args.concurrency, "tok_s": tok_s}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
