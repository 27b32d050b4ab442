"""The exponential race's kernel on CUDA at real shapes (blockspec/seeded_sampling.py): pinning
every row of a verify's probabilities `[B, W, V]` (all rows seeded, none seeded) and the DDTree
scores, each beside the time to read and write those probabilities once (a copy, measured in
the same process), and checked against the torch reference on a slice.

python bench/race_kernel_gpu.py --output race_kernel.json
"""

from __future__ import annotations

import argparse
import json

import torch

from blockspec.seeded_sampling import pin_seeded_rows, race_key, race_scores


def timed(fn, reps: int = 20) -> float:
    """Milliseconds per call (CUDA events, after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--output", required=True)
    ap.add_argument("--vocab", type=int, default=151_936)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for B, W in [(1, 1), (1, 17), (16, 17), (64, 1), (64, 17)]:
        probs = torch.softmax(torch.randn(B, W, args.vocab, device=dev) * 3, -1)
        seeded = torch.tensor([race_key(i) for i in range(B)], device=dev)
        unseeded = torch.zeros_like(seeded)
        positions = torch.arange(W, device=dev)[None, :] + torch.arange(B, device=dev)[:, None] * 7
        work = probs.clone()
        copy_ms = timed(lambda: work.copy_(probs))
        pin_ms = timed(lambda: pin_seeded_rows(work.copy_(probs), seeded, positions)) - copy_ms
        none_ms = timed(lambda: pin_seeded_rows(work, unseeded, positions))
        scores_ms = timed(lambda: race_scores(probs, seeded, positions))
        ref = pin_seeded_rows(probs[:2].clone(), seeded[:2], positions[:2], kernel=False)
        got = pin_seeded_rows(probs[:2].clone(), seeded[:2], positions[:2], kernel=True)
        rows.append({"batch": B, "width": W, "vocab": args.vocab, "copy_ms": copy_ms, "pin_all_seeded_ms": pin_ms,
                     "pin_none_seeded_ms": none_ms, "scores_ms": scores_ms, "pin_over_copy": pin_ms / copy_ms,
                     "kernel_equals_reference": bool(torch.equal(ref, got))})
        print(json.dumps(rows[-1]), flush=True)
    with open(args.output, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
