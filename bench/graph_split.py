"""The GPU work of each captured decode graph, by engine: the plain engine, the speculative engine,
and the speculative engine with its plain step's deferred-context append taken out (issue 15: what a
speculative engine's plain step costs the GPU beyond a plain engine's, and which part of it is the
drafter-context ring). Each graph is replayed on its captured inputs and timed with CUDA events
(`WidthGraphs.replay_seconds`); nothing else runs. JSON to `--output`.

`--ddtree`: a DDTree engine's graphs too (budget one less than the chain's width), and for one
bucket (`--profile-batch`) at the full width, greedy and sampled, the chain's and the tree's
kernels inside one replay (torch.profiler), by name: where a tree step's extra over a chain's goes.

    python bench/graph_split.py --batches 1,16,64 --output /tmp/graph_split.json     (CUDA only)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockspec.llm import LLM  # noqa: E402
from blockspec.speculative.proposers import DeferredContext  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def replay_ms(engine, batches: list[int], widths: set[int]) -> dict[str, float]:
    return {f"b{b} w{w} {v}": round(t * 1e3, 4) for (b, w, v), t in sorted(engine.graphed.replay_seconds(reps=9).items())
            if b in batches and w in widths}


def emit(doc: dict, output: str | None) -> None:
    """Print the JSON, and write it to `output` when given."""
    print(json.dumps(doc, indent=1))
    if output:
        Path(output).write_text(json.dumps(doc, indent=1))


def kernel_table(engine, bucket: int, width: int, variant: str, top: int = 30) -> list[list]:
    """[kernel name, µs, launches] inside one replay of a graph, most time first."""
    from torch.profiler import ProfilerActivity, profile
    graphed = engine.graphed.at(width)
    st = graphed.static[bucket, variant]
    graphed._replay(st, bucket)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graphed._replay(st, bucket)
        torch.cuda.synchronize()
    rows = [[e.key[:90], round(e.device_time_total, 1), e.count] for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return [["total", round(sum(r[1] for r in rows), 1), sum(r[2] for r in rows)]] + rows[:top]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--widths", default="1,4,16", help="the speculative engine's widths reported")
    ap.add_argument("--ddtree", action="store_true", help="a DDTree engine's graphs and both engines' kernels")
    ap.add_argument("--profile-batch", type=int, default=16)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("graph_split needs CUDA", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    widths = {int(w) for w in args.widths.split(",")}
    common = dict(device="cuda", dtype=args.dtype, max_running_requests=max(batches))
    doc = {"device": torch.cuda.get_device_name(), "args": vars(args)}
    engine = LLM(str(BUNDLED / "target"), **common).engine
    doc["plain"] = replay_ms(engine, batches, {1})
    del engine
    spec = dict(spec="dflash", draft_model=str(BUNDLED / "drafter"), **common)
    engine = LLM(str(BUNDLED / "target"), **spec).engine
    doc["spec"] = replay_ms(engine, batches, widths)
    full = max(engine.graphed.by_width)
    if args.ddtree:
        doc["kernels_chain"] = {v: kernel_table(engine, args.profile_batch, full, v) for v in ("greedy", "sampled")}
    del engine
    if args.ddtree:
        tree = dict(spec="ddtree", draft_model=str(BUNDLED / "drafter"), tree_budget=full - 1, **common)
        engine = LLM(str(BUNDLED / "target"), **tree).engine
        doc["ddtree"] = replay_ms(engine, batches, widths)
        doc["ddtree_over_chain"] = {k: round(v / doc["spec"][k], 3) for k, v in doc["ddtree"].items() if k in doc["spec"]}
        doc["kernels_tree"] = {v: kernel_table(engine, args.profile_batch, full, v) for v in ("greedy", "sampled")}
        del engine
    add = DeferredContext.add
    DeferredContext.add = lambda self, *a: None          # captured without the ring's append
    try:
        doc["spec_no_ring"] = replay_ms(LLM(str(BUNDLED / "target"), **spec).engine, batches, {1})
    finally:
        DeferredContext.add = add
    doc["spec_w1_minus_plain_ms"] = {k: round(doc["spec"][k] - v, 4) for k, v in doc["plain"].items()}
    doc["ring_ms"] = {k: round(doc["spec"][k] - v, 4) for k, v in doc["spec_no_ring"].items()}
    emit(doc, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
