"""Steady-state decode steps at a fixed batch (issue 15): the plain engine against the speculative
engine held at one width (plain = width 1, chains) and left to its adaptive policy, so that what a
speculative engine's plain step costs beyond a plain engine's, and where the policy's choices land
against the widths it chooses from, are measured on one batch of long requests with no ramp or tail.

Per batch size: B requests (T as given, no seeds, eos ignored) prefilled, `--warmup` steps, then
`--steps` steps timed on the wall clock (per step: the median of `--rounds` rounds) with the
overlapped schedule on (the default engine), one round with it off, and (`--profile`, CUDA) the
kernel time per synchronous step from torch.profiler with its top kernels. JSON to `--output`.

    python bench/steady_steps.py --device cuda --dtype bfloat16 --batches 1,16,64 --output steady.json
    python bench/steady_steps.py --batches 2 --steps 3 --warmup 1 --widths 1,4   (CPU smoke)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root

from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def fill(engine, batch: int, temperature: float, max_tokens: int) -> None:
    """`batch` fresh requests, prefilled (every one has its first token)."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"s{time.monotonic_ns()}-{i}", [5, 6, 7, 8 + i % 50] * 2, params)
    while engine.scheduler.waiting or any(s.is_prefilling or s.num_output == 0 for s in engine.scheduler.running):
        engine.step()


def drain(engine) -> None:
    for s in list(engine.scheduler.running):
        engine.abort_request(s.request_id)
    while engine.has_unfinished_requests():
        engine.step()


def time_steps(engine, steps: int) -> float:
    """Wall seconds per step over `steps` steps (each returns a committed step's outputs)."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def gpu_ms_per_step(engine, steps: int) -> tuple[float, list]:
    """Summed CUDA kernel time per step (synchronous engine), and its top kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / 1e3 / steps
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:12]
    return total, [(e.key[:90], round(e.self_device_time_total / 1e3 / steps, 4), e.count // steps) for e in top]


def measure(engine, label: str, args, batch: int, force: int | None) -> dict:
    policy = engine.policy
    if policy is not None:
        real = policy._choose
        policy._choose = (lambda seqs, ids: force) if force is not None else real
        policy._quiet = None          # (a quiet stretch would repeat plain past the forced width)
    fill(engine, batch, args.temperature, args.max_tokens)
    for _ in range(args.warmup):
        engine.step()
    overlap = engine.overlap
    row = {"engine": label, "batch": batch, "width": force}
    if args.cprofile:                # where the host's time goes, overlapped steps
        import cProfile
        import io
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
        time_steps(engine, args.steps)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.cprofile)
        print(f"== {label} batch {batch} width {force}: host profile of {args.steps} steps\n{text.getvalue()}")
    rounds = [time_steps(engine, args.steps) for _ in range(args.rounds)]
    row["ms_overlap" if overlap else "ms"] = round(statistics.median(rounds) * 1e3, 4)
    if overlap:                      # the same steps synchronous (the step in flight read first)
        if engine.in_flight is not None:
            engine._finish_in_flight()
        engine.overlap = False
        row["ms_sync"] = round(time_steps(engine, args.steps) * 1e3, 4)
        engine.overlap = True
    if engine.device.type == "cuda" and args.profile and force in (None, 1):
        engine.overlap = False
        row["gpu_ms"], row["gpu_top"] = gpu_ms_per_step(engine, 10)
        engine.overlap = overlap
    row["batch_at_end"] = len(engine.scheduler.running)    # < batch: rows finished while timed
    if policy is not None:
        row["policy_mix"] = dict(policy.choices)
        row["cost_table_ms"] = {w: None if t is None else round(t * 1e3, 4)
                                for w, t in policy.cost.table(batch).items()}
        policy.choices.clear()
        policy._choose = real
    drain(engine)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--widths", default="1,2,4,16", help="widths the speculative engine is held at")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=480)
    ap.add_argument("--adaptive-steps", type=int, default=150, help="steps the free adaptive engine runs first")
    ap.add_argument("--profile", action="store_true", help="CUDA kernel time per step (torch.profiler)")
    ap.add_argument("--cprofile", type=int, default=0, help="print the top N host functions (cProfile) per cell")
    ap.add_argument("--no-adaptive", action="store_true", help="skip the free adaptive cell")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    common = dict(device=args.device, dtype=args.dtype, max_running_requests=max(batches))
    plain = LLM(str(BUNDLED / "target"), **common).engine
    spec = LLM(str(BUNDLED / "target"), spec="dflash", draft_model=str(BUNDLED / "drafter"), **common).engine
    replay_ms = {}
    if args.device == "cuda":        # each graph's replay alone (GPU work, gaps between kernels included)
        for label, engine in (("plain", plain), ("spec", spec)):
            replay_ms[label] = {f"b{b} w{w} {v}": round(t * 1e3, 4)
                                for (b, w, v), t in sorted(engine.graphed.replay_seconds().items()) if b in batches}
            print(label, "graph replay ms:", json.dumps(replay_ms[label]), flush=True)
    rows = []
    for batch in batches:
        rows.append(measure(plain, "plain", args, batch, None))
        for w in widths:
            rows.append(measure(spec, "spec", args, batch, w))
        # The policy free: it first runs `adaptive_steps` steps on this batch (its cost table
        # for the bucket, its acceptance figures), then is timed like the others.
        if not args.no_adaptive:
            saved = args.warmup
            args.warmup = args.adaptive_steps
            rows.append(measure(spec, "adaptive", args, batch, None))
            args.warmup = saved
        for r in rows[-len(widths) - 2 + args.no_adaptive:]:
            print(json.dumps({k: v for k, v in r.items() if k != "gpu_top"}), flush=True)
    doc = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "args": vars(args),
           "replay_ms": replay_ms, "rows": rows}
    if args.output:
        Path(args.output).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
