"""Where a steady overlapped decode step's host time goes, plain engine against the speculative
engine held at width 1 (issue 15: on the H100 at 16 rows both are host-bound and the speculative
engine's plain step costs ≈ 0.13 ms more, with 0.03 ms more GPU work).

The engine's own functions are wrapped with wall-clock accumulators (no profiler: its per-call
overhead would swamp functions of a few µs), then `--steps` overlapped steps run on one batch of
long requests (bench/steady_steps.py's set-up) and each function's µs per step is printed, nested
ones included in their callers. JSON to `--output`.

    python bench/host_split.py --device cuda --dtype bfloat16 --batches 16,64
    python bench/host_split.py --batches 2 --steps 5        (CPU smoke)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import blockspec.engine.engine as engine_module  # noqa: E402
from blockspec.batch import PackedStep  # noqa: E402
from blockspec.engine.overlap import InFlightStep  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from steady_steps import BUNDLED, drain, fill, time_steps  # noqa: E402


WRAPPED: list = []      # (owner, name, what `vars(owner)` held before, or None): `unwrap` restores them


def wrap(owner, name: str, label: str, acc: dict) -> None:
    """Replace `owner.name` (an instance's method or attribute, or a class's function) by a timed call."""
    inner = getattr(owner, name)
    WRAPPED.append((owner, name, vars(owner).get(name)))

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - start
    setattr(owner, name, timed)


ENGINE_METHODS = ("step", "_decode_step", "_finish_in_flight", "_commit_step", "_uniforms", "_step_options")


def unwrap() -> None:
    while WRAPPED:
        owner, name, before = WRAPPED.pop()
        if before is None:
            delattr(owner, name)
        else:
            setattr(owner, name, before)


def instrument(engine, acc: dict) -> None:
    for name in ENGINE_METHODS:
        wrap(engine, name, f"engine.{name}", acc)
    wrap(engine.scheduler, "schedule", "scheduler.schedule", acc)
    if engine.policy is not None:
        wrap(engine.policy, "choose", "policy.choose", acc)
        wrap(engine.policy, "observe", "policy.observe", acc)
    if engine.proposer is not None:
        wrap(engine.proposer, "flush_context", "proposer.flush_context", acc)
    for graphed in (engine.graphed.by_width.values() if engine.graphed is not None else ()):
        wrap(graphed, "launch", f"graphed.launch (w{graphed.width})", acc)
        wrap(graphed, "_replay", f"graphed._replay (w{graphed.width})", acc)
        if graphed.after_replay is not None:      # (bound at capture: wrapped where it is kept)
            wrap(graphed, "after_replay", f"graphed.after_replay (w{graphed.width})", acc)


def write_rows(args, rows: list[dict]) -> None:
    """The run's rows as JSON to `args.output` (if given), with the device and the arguments."""
    if args.output:
        Path(args.output).write_text(json.dumps({"device": torch.cuda.get_device_name() if args.device == "cuda"
                                                 else "cpu", "args": vars(args), "rows": rows}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=480)
    ap.add_argument("--cpu-graphs", action="store_true",
                    help="on a CPU: the static-buffer graph path, overlapped, as on CUDA (bench/plain_step_gap.py)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    common = dict(device=args.device, dtype=args.dtype, max_running_requests=max(batches))
    engines = {"plain": LLM(str(BUNDLED / "target"), **common).engine,
               "spec w1": LLM(str(BUNDLED / "target"), spec="dflash", draft_model=str(BUNDLED / "drafter"),
                              **common).engine}
    if engines["spec w1"].policy is not None:
        engines["spec w1"].policy._choose = lambda seqs, ids: 1
    if args.cpu_graphs:
        for e in engines.values():
            e.graphed = e.capture_graphs()
            e.overlap, e.scheduler.steps_ahead = True, 1
    shared = defaultdict(float)             # class-level pieces, cleared before each timed run
    rows = []
    for batch in batches:
        for label, engine in engines.items():
            acc = defaultdict(float)
            for owner, name, piece in ((PackedStep, "fill", "PackedStep.fill"),
                                       (InFlightStep, "result", "InFlightStep.result"),
                                       (engine_module, "launch_decode", "launch_decode")):
                wrap(owner, name, piece, shared)
            instrument(engine, acc)
            fill(engine, batch, args.temperature, args.max_tokens)
            for _ in range(args.warmup):
                engine.step()
            acc.clear()
            shared.clear()
            seconds = time_steps(engine, args.steps)
            split = {k: round(v / args.steps * 1e6, 1) for k, v in sorted({**acc, **shared}.items(), key=lambda kv: -kv[1])}
            row = {"engine": label, "batch": batch, "us_per_step": round(seconds * 1e6, 1), "split_us": split,
                   "overlap": engine.overlap}
            print(json.dumps(row), flush=True)
            rows.append(row)
            drain(engine)
            unwrap()                               # the next batch wraps afresh
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
