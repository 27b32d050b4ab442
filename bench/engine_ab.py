"""The plain engine against the speculative (adaptive) engine in one process, whole requests at
concurrency 1 (issue 15): each engine generates the same held-out ShareGPT prompts one at a time,
alternating, so both see the same machine state; then a 300-token prefill timed on each (the
speculative engine also writes the drafter's context for the prompt). CPU by default.

    OMP_NUM_THREADS=1 python bench/engine_ab.py --num-prompts 16 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root

from blockspec.bench.datasets import load_dataset  # noqa: E402
from blockspec.bench.offline import prompt_token_ids  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = {"plain": LLM(max_running_requests=16, spec="none"), "adaptive": LLM(max_running_requests=16, spec="dflash")}
    prompts = load_dataset("sharegpt", args.num_prompts, 0)
    ids = [prompt_token_ids(p, engines["plain"].tokenizer, 400) for p in prompts]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)

    def run(llm) -> tuple[float, int]:
        start, tokens = time.perf_counter(), 0
        for prompt in ids:
            tokens += len(llm.generate([prompt], params)[0].token_ids)
        return time.perf_counter() - start, tokens

    for llm in engines.values():          # warm-up round, not reported
        run(llm)
    for r in range(args.rounds):
        for name, llm in engines.items():
            seconds, tokens = run(llm)
            print(f"round {r}: {name:8s} {seconds:6.2f} s  {tokens} tokens  {tokens / seconds:6.1f} tok/s", flush=True)
    prefill = SamplingParams(temperature=1.0, max_tokens=1)
    prompt = list(range(100, 400))
    for name, llm in engines.items():
        llm.generate([prompt], prefill)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            llm.generate([prompt], prefill)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"prefill of 300 tokens + 1 sampled: {name:8s} ms {sorted(round(t, 1) for t in times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
