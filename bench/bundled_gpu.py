"""The bundled pair on one GPU: tokens/s at batch 1 (plain, DFlash, DDTree-16) with the fast path,
and greedy equality — fast path (Triton + CUDA graphs) vs the eager reference path on the GPU, vs
plain decoding, and vs CPU float32 token ids computed beforehand (`--cpu-reference`, written by
`--write-cpu-reference` on a CPU machine).

    python bench/bundled_gpu.py --output bundled_gpu.json [--cpu-reference bench/results/bundled_cpu_reference.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root

PROMPTS = [
    "Write a short poem about the sea.", "What is the capital of France?", "Explain how a bicycle works.",
    "Give me three tips for learning Python.", "Tell me a story about a dragon.", "Why is the sky blue?",
    "How do I make a cup of tea?", "Summarise the plot of Romeo and Juliet.",
    "What are the benefits of exercise?", "Describe a perfect day.", "How does the internet work?",
    "Write a recipe for pancakes.", "What is machine learning?", "Name five animals that live in Africa.",
    "Write a letter to a friend.", "What should I pack for a trip to the mountains?",
]
METHODS = {"none": {}, "ngram": {"block_size": 8}, "dflash": {}, "ddtree": {"budget": 16}}


def generate(method: str, device: str, dtype: str, batch: int, max_tokens: int, **engine):
    from blockspec.llm import LLM
    from blockspec.sampling import SamplingParams
    llm = LLM(spec=method, device=device, dtype=dtype, max_running_requests=batch, **METHODS[method], **engine)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    # Warm-up: every prompt once, so the timed run sees no first-shape compilation (a
    # startup cost, measured apart by bench/host_overhead.py --prefill-lengths).
    for i in range(0, len(chats), batch):
        llm.chat(chats[i:i + batch], params)
    start = time.perf_counter()
    outs = []
    for i in range(0, len(chats), batch):
        outs += llm.chat(chats[i:i + batch], params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    steps = sum(o.metrics.verify_steps for o in outs) if method != "none" else tokens
    return {"ids": [o.token_ids for o in outs], "tok_per_s": tokens / seconds,
            "accept_length": tokens / max(steps, 1) if method != "none" else 1.0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--cpu-reference", default=None)
    ap.add_argument("--write-cpu-reference", default=None, help="write plain greedy float32 CPU ids here")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager reference runs (tokens/s only)")
    ap.add_argument("--compare-overlap", action="store_true",
                    help="also run without overlapped decoding: its tokens/s and whether the ids are equal")
    args = ap.parse_args()
    if args.write_cpu_reference:
        ref = generate("none", "cpu", "float32", 16, args.max_tokens)
        json.dump({"max_tokens": args.max_tokens, "ids": ref["ids"]}, open(args.write_cpu_reference, "w"))
        return 0
    result = {"prompts": PROMPTS, "max_tokens": args.max_tokens, "dtype": args.dtype, "runs": {}}
    cpu = json.load(open(args.cpu_reference))["ids"] if args.cpu_reference else None
    for batch in (1, 16):
        plain_ids = None
        for method in METHODS:
            fast = generate(method, "cuda", args.dtype, batch, args.max_tokens)
            plain_ids = plain_ids or fast["ids"]
            row = {"tok_per_s": fast["tok_per_s"], "accept_length": fast["accept_length"],
                   "equals_plain": sum(a == b for a, b in zip(fast["ids"], plain_ids)), "prompts": len(PROMPTS)}
            if not args.no_eager:
                eager = generate(method, "cuda", args.dtype, batch, args.max_tokens, cuda_graph=False,
                                 attention_backend="reference")
                row["eager_reference_tok_per_s"] = eager["tok_per_s"]
                row["fast_equals_eager_reference"] = sum(a == b for a, b in zip(fast["ids"], eager["ids"]))
            if args.compare_overlap:
                sync = generate(method, "cuda", args.dtype, batch, args.max_tokens, overlap_schedule=False)
                row["no_overlap_tok_per_s"] = sync["tok_per_s"]
                row["overlap_equals_no_overlap"] = sum(a == b for a, b in zip(fast["ids"], sync["ids"]))
            if cpu:
                row["equals_cpu_float32"] = sum(a == b[:len(a)] for a, b in zip(fast["ids"], cpu))
            result["runs"][f"{method}_batch{batch}"] = row
            print(method, batch, {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    json.dump(result, open(args.output, "w"), indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
