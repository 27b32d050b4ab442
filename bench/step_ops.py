"""The torch ops one decode step runs, chain engine against DDTree engine, at one width (CPU,
eager, torch.profiler's top-level aten ops): whether a tree engine's step does work a chain
engine's does not, as launches (bench/results/gpu_session_q/: on the H100 the tree engine's
width-1 graph costs 1.3× the chain engine's).

    OMP_NUM_THREADS=1 python bench/step_ops.py --width 1 [--batch 16] [--temperature 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockspec.engine.spec_policy import SpecPolicy  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def step_ops(llm, batch: int, temperature: float) -> collections.Counter:
    engine = llm.engine
    for i in range(batch):
        engine.add_request(str(i), [5 + i, 7, 9, 11], SamplingParams(temperature=temperature, max_tokens=200, ignore_eos=True))
    for _ in range(4):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::")
                               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    SpecPolicy.choose = lambda self, seqs: args.width
    common = dict(draft_model=str(BUNDLED / "drafter"), device="cpu", dtype="float32", max_running_requests=args.batch)
    ops = {name: step_ops(LLM(str(BUNDLED / "target"), **common, **kw), args.batch, args.temperature)
           for name, kw in (("chain", dict(spec="dflash")), ("tree", dict(spec="ddtree", tree_budget=15)))}
    c, t = ops["chain"], ops["tree"]
    diff = sorted(((k, t[k] - c[k]) for k in set(c) | set(t) if t[k] != c[k]), key=lambda kv: -abs(kv[1]))
    print(json.dumps({"args": vars(args), "ops": {k: sum(v.values()) for k, v in ops.items()},
                      "tree_minus_chain": dict(diff[:30])}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
