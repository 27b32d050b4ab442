"""Steady decode steps of the bundled pair with top_p filtering (issue 16's T > 0 settings), with the
CPU's prefix selection of filtered probabilities (`sampling_filters.filtered_probs_prefix`, the
default on a CPU) against one full sort a row (`filtered_probs_sorted_exact`, the CUDA path), and
other candidate sizes: ms per step, static widths, one torch thread.

    OMP_NUM_THREADS=1 python bench/filter_step_cpu.py --output filter_steps.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import blockspec.sampling as sampling  # noqa: E402
import blockspec.sampling_filters as filters  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def step_ms(spec: str, temperature: float, top_p: float, seeded: bool, rows: int, steps: int) -> float:
    kw = {"spec": spec} if spec == "none" else {"spec": spec, "draft_model": str(BUNDLED / "drafter"),
                                                "spec_policy": "static"}
    engine = LLM(model=str(BUNDLED / "target"), **kw).engine
    for i in range(rows):
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=480, ignore_eos=True,
                                seed=100 + i if seeded else None)
        engine.add_request(f"r{i}", [5, 6, 7, 8 + i] * 2, params)
    while engine.scheduler.waiting or any(s.is_prefilling or s.num_output == 0 for s in engine.scheduler.running):
        engine.step()
    for _ in range(3):
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    real = sampling.filtered_probs_prefix
    doc = {"command": "python bench/filter_step_cpu.py " + " ".join(sys.argv[1:]), "rows": args.rows, "cells": []}
    for spec, temperature, seeded in (("dflash", 0.6, False), ("dflash", 1.0, False), ("dflash", 1.0, True),
                                      ("none", 0.6, False)):
        for name, impl in (("sort", lambda logits, st: filters.filtered_probs_sorted_exact(logits, st)),
                           ("prefix", real), ("prefix 256", functools.partial(real, sizes=(256,)))):
            sampling.filtered_probs_prefix = impl
            ms = step_ms(spec, temperature, 0.95, seeded, args.rows, args.steps)
            cell = {"spec": spec, "temperature": temperature, "top_p": 0.95, "seeded": seeded, "filters": name,
                    "ms_per_step": round(ms, 1)}
            print(json.dumps(cell), flush=True)
            doc["cells"].append(cell)
    sampling.filtered_probs_prefix = real
    if args.output:
        Path(args.output).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
