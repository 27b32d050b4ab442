"""Where the time of `LLM.chat` goes end to end (the bundled pair, batch 1): tokens/s and the
host profile of a few greedy chats, per method.

    python bench/llm_profile.py --device cuda --methods none,dflash
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root

from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402

PROMPTS = ["Write a short poem about the sea.", "What is the capital of France?", "Explain how a bicycle works.",
           "Give me three tips for learning Python."]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--methods", default="none,dflash")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for method in args.methods.split(","):
        llm = LLM(spec=method, device=args.device, dtype=args.dtype, max_running_requests=1)
        llm.chat([{"role": "user", "content": "Hello"}], params)
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.enable()
        outs = [llm.chat([{"role": "user", "content": p}], params)[0] for p in PROMPTS]
        prof.disable()
        seconds = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outs)
        print(f"== {method}: {tokens / seconds:.0f} tok/s ({seconds * 1e3 / tokens:.2f} ms a token)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
