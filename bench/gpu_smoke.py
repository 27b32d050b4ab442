"""The engine on CUDA with the bundled pair: greedy output of DFlash and DDTree (budget 16, and 4,
where a row can be a full-depth chain beside branching rows) equals plain
greedy output, and seeded sampling runs. Prints one line per check; exit 1 on a mismatch."""

import sys
import time

import torch

from blockspec import LLM, SamplingParams

PROMPTS = ["Write a short story about a lighthouse keeper.", "How do I sort a list in Python?",
           "Explain photosynthesis to a child.", "What is the capital of France?"]


def main() -> int:
    print(torch.cuda.get_device_name(), flush=True)
    greedy = SamplingParams(temperature=0, max_tokens=64)
    runs = {}
    for spec, kw in (("none", {}), ("dflash", {}), ("ddtree", {"budget": 16}), ("ddtree", {"budget": 4})):
        llm = LLM(device="cuda", spec=spec, **kw)
        start = time.perf_counter()
        outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], greedy)
        name = spec + str(kw.get("budget", ""))
        runs[name] = [o.token_ids for o in outs]
        tau = [o.metrics.accept_length for o in outs] if spec != "none" else []
        print(f"{name}: {time.perf_counter() - start:.2f} s, accept lengths {tau}", flush=True)
        sampled = llm.chat([[{"role": "user", "content": PROMPTS[0]}]], SamplingParams(temperature=1, seed=3,
                                                                                        max_tokens=32))
        print(f"{name}: sampled {len(sampled[0].token_ids)} tokens", flush=True)
    same = {spec: runs[spec] == runs["none"] for spec in runs}
    print(f"greedy equal to plain: {same}", flush=True)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
