"""A static DFlash engine of block W against the default block-16 engine held at width W, with
`draft_block` "width" and "full", stepped alternately on the same kind of batch (greedy, the
bundled pair, no EOS): what drafting the whole block costs a narrow width (bench/results/adaptive_cpu).

    OMP_NUM_THREADS=1 python bench/draft_block_ab.py [--width 4] [--rows 4] [--rounds 4] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockspec.llm import LLM  # noqa: E402
from steady_steps import BUNDLED, fill  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    common = dict(model=str(BUNDLED / "target"), draft_model=str(BUNDLED / "drafter"), spec="dflash",
                  max_running_requests=args.rows, device=args.device, dtype=args.dtype)
    engines = {f"static block {args.width}": LLM(block_size=args.width, spec_policy="static", **common).engine}
    for block in ("width", "full"):
        engine = LLM(draft_block=block, **common).engine
        engine.policy._choose = lambda seqs, ids, w=args.width: w          # held at the width
        engine.policy._quiet = None
        engines[f"block 16 at width {args.width}, draft_block {block}"] = engine
    for engine in engines.values():
        fill(engine, args.rows, 0.0, 480)
        for _ in range(5):
            engine.step()
    rounds = {name: [] for name in engines}
    for _ in range(args.rounds):          # alternately: the contexts grow alike
        for name, engine in engines.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            rounds[name].append(round((time.perf_counter() - start) / args.steps * 1e3, 2))
    print(json.dumps({"command": "python bench/draft_block_ab.py " + " ".join(sys.argv[1:]), "ms_per_step": rounds},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
