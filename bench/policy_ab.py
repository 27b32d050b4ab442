"""A/B of one adaptive-policy feature on one engine (issue 15): `bench offline --compare-static`'s
workload at one concurrency (T = 1, 32 held-out ShareGPT prompts, 64 tokens), rounds alternating
the feature on and off on the same adaptive engine, beside a plain engine; tok/s per round and the
adaptive rounds' share of plain steps. Features: `quiet` (quiet plain stretches: QUIET_STEPS 8
against 0), `flush` (a pending drafter-context write charged to leaving plain, against not),
`rates` (chains' per-position acceptance rates, against per-width figures; a fresh model each
round, either way).

    OMP_NUM_THREADS=1 python bench/policy_ab.py --feature quiet|flush|rates [--concurrency 16] [--rounds 4]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import blockspec.engine.spec_policy as spec_policy  # noqa: E402
from blockspec.bench.compare import run_concurrency  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from bundled_workload import BUNDLED, bundled_dflash, sharegpt_requests  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--feature", choices=["quiet", "flush", "rates"], default="quiet")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    common = dict(device=args.device, dtype=args.dtype, max_running_requests=args.concurrency)
    adaptive = bundled_dflash(spec_policy="adaptive", **common)
    plain = LLM(str(BUNDLED / "target"), **common)
    ids, params = sharegpt_requests(adaptive, 32, 64, args.temperature)
    charged = spec_policy.SpecPolicy._charged

    def feature(on: bool) -> None:
        if args.feature == "quiet":
            spec_policy.QUIET_STEPS = 8 if on else 0
        elif args.feature == "rates":
            policy = adaptive.engine.policy
            policy.acceptance = (spec_policy.ChainAcceptance if on else spec_policy.AcceptanceModel)(policy.widths)
        else:
            spec_policy.SpecPolicy._charged = charged if on else (lambda self, costs: costs)
    for llm in (adaptive, plain):                  # warm: every bucket once
        run_concurrency(llm, ids[:args.concurrency], params, args.concurrency)
    tok_s = {"on": [], "off": [], "plain": []}
    plain_share = {"on": [], "off": []}
    for _ in range(args.rounds):
        for name in tok_s:
            if name != "plain":
                feature(name == "on")
            before = dict(adaptive.engine.policy.choices)
            record = run_concurrency(plain if name == "plain" else adaptive, ids, params, args.concurrency)
            tok_s[name].append(round(record["tok_s"], 1))
            if name != "plain":
                steps = {k: v - before.get(k, 0) for k, v in adaptive.engine.policy.choices.items()}
                plain_share[name].append(round(steps.get("plain", 0) / max(1, sum(steps.values())), 3))
    print(json.dumps({"feature": args.feature, "concurrency": args.concurrency, "temperature": args.temperature,
                      "tok_s": tok_s, "adaptive_plain_share": plain_share}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
