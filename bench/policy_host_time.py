"""The adaptive policy's own host time per step (issue 15: < 2 % of the step), on this machine.

    python bench/policy_host_time.py [--rows 1 16 64] [--steps 2000] [--plain]

Drives `SpecPolicy.choose` and `observe` (the engine's calls) for a batch of greedy rows at
DFlash block 16 (widths 1, 2, 4, 8, 16) with synthetic accepted paths and timings, and prints
µs per step per batch size; `--plain`: sampled rows whose drafts are always rejected and wide
steps that cost more, so that the policy settles on plain decoding (T = 1 at high concurrency); set them beside a step's time (bench/results: the bundled pair's
graphed DFlash step ≈ 0.7 ms at batch 1, the 8B shape's ≈ 6 ms)."""

import argparse
import json
import time
from types import SimpleNamespace

from blockspec.engine.sequence import Status
from blockspec.engine.spec_policy import SpecPolicy
from blockspec.speculative.step import StepResult


def policy_us_per_step(rows: int, steps: int, plain: bool = False) -> float:
    policy = SpecPolicy("adaptive", 16, False, [1, 2, 4, 8, 16, 32, 64])
    # Rows carry what the policy reads of the engine's `Sequence`s (a missing `status` would time
    # getattr's AttributeError instead).
    seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                            params=SimpleNamespace(greedy=not plain, temperature=float(plain), seed=None))
            for i in range(rows)]
    clock = 0.0
    for k in range(steps + 100):
        if k == 100:
            policy.host_seconds = 0.0          # after the buckets' exploration
        w = policy.choose(seqs)
        accepted = [0 if plain else min((i + k) % 7, w - 1) for i in range(rows)]
        step = StepResult([[0]] * rows, accepted, [w - 1] * rows, [list(range(1, a + 1)) for a in accepted])
        clock += 0.001 * (1 + (0.5 if plain else 0.05) * w)
        policy.observe(seqs, w, step, now=clock)
    return policy.host_seconds / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--plain", action="store_true", help="a batch the policy keeps at plain decoding")
    args = ap.parse_args()
    print(json.dumps({str(b): round(policy_us_per_step(b, args.steps, args.plain), 1) for b in args.rows}))


if __name__ == "__main__":
    main()
