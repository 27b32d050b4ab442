"""DDTree against linear DFlash on the bundled pair: accept length and tokens/s (eager engine).

python bench/ddtree_vs_chain.py --output bench/results/ddtree_vs_chain_cpu.json
Same prompts (held-out ShareGPT first turns), same seeds, one engine per configuration.
"""

import argparse
import json
import platform
import sys
import time

import torch

from blockspec.bench.acceptance import load_prompt_sets, measure
from blockspec.bundled import DRAFTER_DIR, TARGET_DIR
from blockspec.llm import LLM


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="4,8,16,32,64")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    configs = [("none", {}), ("dflash", {"block_size": 16})]
    configs += [("ddtree", {"budget": int(b)}) for b in args.budgets.split(",")]
    prompts = None
    records = []
    for spec, kw in configs:
        draft = None if spec == "none" else str(DRAFTER_DIR)
        llm = LLM(model=str(TARGET_DIR), spec=spec, draft_model=draft, max_running_requests=max(args.batch, 1),
                  device=args.device, **kw)
        prompts = prompts or load_prompt_sets(llm.tokenizer, args.num_prompts, ["sharegpt"])["sharegpt"]
        for t in (float(x) for x in args.temperatures.split(",")):
            rec = {"spec": spec, **kw, "temperature": t, **measure(llm, prompts, t, args.max_tokens, args.batch)}
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items()
                              if k != "acceptance_per_position"}), flush=True)
            records.append(rec)
    machine = (torch.cuda.get_device_name() if args.device.startswith("cuda") else
               f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, CPU")
    out = {"command": "python " + " ".join(sys.argv), "machine": machine, "date": time.strftime("%Y-%m-%d"),
           "records": records}
    with open(args.output, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
