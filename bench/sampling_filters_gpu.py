"""Sampling filters on CUDA at a full vocabulary: the sort-based reference vs the sort-free code.

For each row count (1, 17, 16x17, 64x17 by default: one request, one 16-draft verify, and 16 or
64 of them) and each setting (greedy; T=0.6 top_p=0.95; a mixed batch) it builds random logits
over V = 151,936, then
  - checks that the sort-free filters (radix and bisect selection) equal the exact sort-based
    evaluation of the same definition bit for bit (`filtered_probs_sorted_exact`), and counts
    where they differ from the previous float32 implementation (`filtered_probs_sorted`):
    tokens whose keep decision differs (expected only at float32 error of a threshold) and the
    largest probability difference on rows with the same support;
  - checks that the sort-free call does not synchronise with the host
    (torch.cuda.set_sync_debug_mode("error")) and can be captured in a CUDA graph;
  - times every implementation with CUDA events: warm-up, then the median of --iters runs,
    eagerly and as CUDA-graph replays (GPU time without Python launch overhead).
Prints a table, writes JSON to --output, exits 1 when the sort-free result is not exact.

    python bench/sampling_filters_gpu.py --output bench/results/sampling_filters_gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
from cuda_timing import capture_graph, cuda_time_ms

from blockspec.sampling import SamplingParams, SamplingTensors
from blockspec.sampling_filters import (
    filtered_probs_sorted,
    filtered_probs_sorted_exact,
    filtered_probs_sortfree,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SETTINGS = ("greedy", "t06_p095", "mixed")
IMPLEMENTATIONS = {
    "sorted": filtered_probs_sorted,
    "sortfree_radix": lambda logits, st: filtered_probs_sortfree(logits, st, method="radix"),
    "sortfree_bisect": lambda logits, st: filtered_probs_sortfree(logits, st, method="bisect"),
    "sorted_exact": filtered_probs_sorted_exact,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="JSON results path")
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 17, 16 * 17, 64 * 17])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    p.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS))
    p.add_argument("--logits-dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--logit-scale", type=float, default=3.0, help="std of the random logits")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graph", dest="graph", action="store_false", help="skip the CUDA-graph timings")
    return p.parse_args(argv)


def params_for(setting: str, rows: int) -> list[SamplingParams]:
    if setting == "greedy":
        return [SamplingParams(temperature=0.0)] * rows
    if setting == "t06_p095":
        return [SamplingParams(temperature=0.6, top_p=0.95)] * rows
    mixed = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.6, top_p=0.95),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.2, top_k=20_000, top_p=0.99),
    ]
    return [mixed[i % len(mixed)] for i in range(rows)]


def make_logits(rows: int, args, gen: torch.Generator, device) -> torch.Tensor:
    """Gaussian logits plus a peaked head on a few tokens per row (like an LM's next-token row)."""
    logits = torch.randn(rows, args.vocab, generator=gen) * args.logit_scale
    head = torch.randint(args.vocab, (rows, 8), generator=gen)
    logits.scatter_add_(-1, head, torch.rand(rows, 8, generator=gen) * 4 * args.logit_scale)
    return logits.to(device=device, dtype=DTYPES[args.logits_dtype])


def capture(fn):
    """(graph, output) of `fn` captured in a CUDA graph, or (None, error text)."""
    try:
        return capture_graph(fn, warmup=2)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def no_host_sync(fn) -> str | None:
    """None when fn runs with sync debug mode "error", else the error."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def compare(got: torch.Tensor, reference: torch.Tensor) -> dict:
    """Support differences and the largest probability difference on rows with the same support."""
    disagree = (got > 0) != (reference > 0)
    same_rows = ~disagree.any(dim=-1)
    diff = (got[same_rows] - reference[same_rows]).abs()
    return {
        "support_mismatch_tokens": int(disagree.sum()),
        "support_mismatch_rows": int((~same_rows).sum()),
        "max_abs_diff_same_support": float(diff.max()) if diff.numel() else 0.0,
    }


def run_case(rows: int, setting: str, args, gen, device) -> dict:
    logits = make_logits(rows, args, gen, device)
    st = SamplingTensors.from_params(params_for(setting, rows), device)
    result = {"rows": rows, "setting": setting, "vocab": args.vocab}

    outputs = {name: IMPLEMENTATIONS[name](logits, st) for name in args.implementations}
    torch.cuda.synchronize()
    exact = outputs.get("sorted_exact")
    for name in ("sortfree_radix", "sortfree_bisect"):
        if name in outputs and exact is not None:
            result[f"{name}_exact"] = bool(torch.equal(outputs[name], exact))
        if name in outputs and "sorted" in outputs:
            result[f"{name}_vs_sorted"] = compare(outputs[name], outputs["sorted"])
    kept = outputs.get("sortfree_radix", outputs.get("sorted"))
    if kept is not None:
        counts = (kept > 0).sum(dim=-1).float()
        result["kept_tokens_mean"] = float(counts.mean())
        result["kept_tokens_max"] = int(counts.max())
    del outputs, exact, kept

    for name in args.implementations:
        fn = IMPLEMENTATIONS[name]
        call = lambda: fn(logits, st)  # noqa: E731
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        result[f"{name}_ms"] = cuda_time_ms(call, args.warmup, args.iters)
        result[f"{name}_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        if name.startswith("sortfree"):
            result[f"{name}_sync_error"] = no_host_sync(call)
        if args.graph:
            graph, out = capture(call)
            if graph is None:
                result[f"{name}_graph_ms"] = None
                result[f"{name}_graph_error"] = out
            else:
                graph.replay()
                torch.cuda.synchronize()
                result[f"{name}_graph_matches_eager"] = bool(torch.equal(out, call()))
                result[f"{name}_graph_ms"] = cuda_time_ms(graph.replay, args.warmup, args.iters)
                del graph, out
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, V {args.vocab}, "
          f"logits {args.logits_dtype}", flush=True)
    names = args.implementations
    header = f"{'rows':>5} {'setting':>9} " + " ".join(f"{n + ' ms':>21}" for n in names) + "  exact  vs sorted"
    print(header)
    print("-" * len(header))
    results, ok = [], True
    started = time.time()
    for rows in args.rows:
        for setting in args.settings:
            r = run_case(rows, setting, args, gen, device)
            results.append(r)

            def fmt(name):
                eager, graph = r.get(f"{name}_ms"), r.get(f"{name}_graph_ms")
                return f"{eager:9.3f} / {'-' if graph is None else f'{graph:.3f}':>9}"

            exact = all(r.get(f"{n}_exact", True) for n in ("sortfree_radix", "sortfree_bisect"))
            synced = [r[k] for k in r if k.endswith("_sync_error") and r[k]]
            ok &= exact and not synced
            mismatch = r.get("sortfree_radix_vs_sorted", {}).get("support_mismatch_tokens", "-")
            print(f"{rows:>5} {setting:>9} " + " ".join(f"{fmt(n):>21}" for n in names)
                  + f"  {'yes' if exact else 'NO':>5}  {mismatch:>9}" + ("  SYNC" if synced else ""), flush=True)
    print("(eager ms / CUDA-graph replay ms; 'vs sorted' = tokens whose keep decision differs from the"
          " float32 sort-based reference)")
    payload = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
        "args": vars(args), "seconds": time.time() - started, "ok": ok, "results": results,
    }
    with open(args.output, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
