"""Host time of one engine decode step, the model's forward replaced by a stub: what the engine
itself costs per step (scheduling, step inputs, commit, stops, detokenization) at a batch size.
With `--real-forward` the step runs whole (on `--device`, CUDA graphs included), so the figure is
a real decode step's wall time and the profile says where it goes.

    python bench/host_overhead.py --batch 64 [--profile]
    python bench/host_overhead.py --device cuda --dtype bfloat16 --real-forward --batch 1 --profile
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--spec", default="none")
    ap.add_argument("--spec-policy", default="adaptive", help="static: every step at the method's full width")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--reference-tree-ops", action="store_true",
                    help="verify trees and draw sampled children by the reference ops on CUDA too (not their "
                    "kernels; the tree search keeps its kernel): the kernels' A/B")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--real-forward", action="store_true", help="keep the model's forward (a whole step)")
    ap.add_argument("--prefill-lengths", default="", help="also time one prefill per prompt length, twice "
                    "(the first includes any kernel compilation a new shape causes)")
    args = ap.parse_args()
    if args.reference_tree_ops:
        import blockspec.speculative.children_kernel as children_kernel
        from blockspec.speculative.sampled_tree import sample_children
        from blockspec.speculative.step import SpeculativeStep
        SpeculativeStep.use_verify_kernels = lambda self, device: None
        children_kernel.sample_children_triton = sample_children    # (the proposer's check then adopts the reference)
    engine = LLM(spec=args.spec, spec_policy=args.spec_policy, max_running_requests=args.batch, device=args.device, dtype=args.dtype).engine
    for i in range(args.batch):
        engine.add_request(f"r{i}", [5, 6, 7, 8 + i % 50] * 4,
                           SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                          max_tokens=4 * args.steps + 20, ignore_eos=True))
    while engine.scheduler.waiting or any(s.is_prefilling for s in engine.scheduler.running):
        engine.step()
    if not args.real_forward:
        vocab = engine.model_config.vocab_size
        engine.runner.verify = lambda inputs, tree: (torch.zeros(*tree.tokens.shape, vocab), None)
    for _ in range(3):
        engine.step()
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(args.steps):
        engine.step()
    if profiler:
        profiler.disable()
    what = "whole step" if args.real_forward else "forward stubbed"
    what += f", T {args.temperature} top_p {args.top_p}" + (", reference tree ops" if args.reference_tree_ops else "")
    print(f"host ms per decode step, batch {args.batch}, spec {args.spec}, {args.device}, {what}: "
          f"{(time.perf_counter() - start) / args.steps * 1e3:.2f}")
    if args.prefill_lengths:
        times = {}
        for rid in list(engine._requests):
            engine.abort_request(rid)
        for n in [int(x) for x in args.prefill_lengths.split(",")]:
            for attempt in range(2):
                rid = f"p{n}-{attempt}"
                engine.add_request(rid, [5 + (i * 7 + attempt) % 90 for i in range(n)],
                                   SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
                start = time.perf_counter()
                while engine.has_unfinished_requests() and rid in engine._requests:
                    engine.step()
                times.setdefault(n, []).append(round((time.perf_counter() - start) * 1e3, 2))
        print("prefill ms by prompt length (first, second):", times)
    if profiler:   # the timed steps themselves (the prefill timing above aborts every request)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
