"""Where one prefill step's host time goes on the GPU (bundled pair, warm): the engine's whole
prefill step timed, then profiled (Python functions by own time; torch ops by CPU time).

    python bench/prefill_profile.py --spec none --lengths 7,130
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root

from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402


def prefill_once(engine, rid: str, n: int) -> float:
    engine.add_request(rid, [5 + (i * 7) % 90 for i in range(n)],
                       SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="none")
    ap.add_argument("--lengths", default="7,130")
    args = ap.parse_args()
    engine = LLM(spec=args.spec, device="cuda", dtype="bfloat16", max_running_requests=4).engine
    for n in [int(x) for x in args.lengths.split(",")]:
        for i in range(3):
            prefill_once(engine, f"w{n}-{i}", n)
        times = [prefill_once(engine, f"t{n}-{i}", n) for i in range(5)]
        print(f"prefill {n} tokens, spec {args.spec}: ms {[round(t, 2) for t in times]}")
        prof = cProfile.Profile()
        prof.enable()
        prefill_once(engine, f"p{n}", n)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            prefill_once(engine, f"q{n}", n)
        print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
