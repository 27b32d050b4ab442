"""Triton paged attention on CUDA at real shapes: checks it against the reference and times both.

For each batch size, context length and step kind (decode Q=1, chain verify Q=16, DFlash block
Q=16 "full", tree verify Q=65) it builds a bf16 paged cache on shuffled pages, runs
`blockspec.attention.triton_paged.paged_attention`, compares it with the float32 reference
(gather through the page table + `masked_attention` over `visibility_mask`), and times the
kernel and the reference path (gather + masked SDPA; the mask is built once per step and is not
timed) with CUDA events: warm-up, then the median of --iters runs, eagerly and as CUDA-graph
replays (the GPU time without Python's launch overhead; KV GB/s uses the graph time). Prints a
table, writes JSON to --output, exits 1 when any case is off by more than --atol.

    python bench/triton_attention_gpu.py --output bench/results/triton_attention.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time

import torch
from cuda_timing import capture_graph, cuda_time_ms

from blockspec.attention.metadata import causal_new_mask, full_new_mask, visibility_mask
from blockspec.attention.reference import masked_attention
from blockspec.kv.cache import gather_slots
from blockspec.speculative.tree import tree_attention_mask

STEPS = {"decode": (1, "causal"), "chain16": (16, "causal"), "block16": (16, "full"), "tree65": (65, "tree")}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="JSON results path")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192], help="cached tokens per row")
    p.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--window", type=int, default=None, help="sliding window (default: none)")
    p.add_argument("--num-splits", type=int, default=None, help="force split-K (default: automatic)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--atol", type=float, default=2e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="skip the CUDA-graph replay timings (no Python launch overhead)")
    p.add_argument("--no-reference-timing", action="store_true", help="check, but only time the kernel")
    return p.parse_args(argv)


def build_case(batch, context, q_len, mode, args, gen, device):
    """Shuffled pages (page 0 reserved), the cache filled with random K/V, q, masks, positions."""
    dtype = DTYPES[args.dtype]
    ps = args.page_size
    prefix = torch.full((batch,), context, dtype=torch.int32)
    new = torch.full((batch,), q_len, dtype=torch.int32)
    pages_per_row = math.ceil((context + q_len) / ps)
    num_pages = batch * pages_per_row + 1
    perm = torch.randperm(num_pages - 1, generator=gen) + 1
    page_table = perm.view(batch, pages_per_row).to(torch.int32)
    slots_n = num_pages * ps
    dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    k = torch.randn(slots_n, args.kv_heads, args.head_dim, generator=dev_gen, device=device).to(dtype)
    v = torch.randn(slots_n, args.kv_heads, args.head_dim, generator=dev_gen, device=device).to(dtype)
    q = torch.randn(batch, q_len, args.q_heads, args.head_dim, generator=dev_gen, device=device).to(dtype)
    depths = torch.arange(q_len).expand(batch, q_len).clone()
    if mode == "tree":
        parents = torch.full((batch, q_len), -1, dtype=torch.long)
        for b in range(batch):
            for i in range(1, q_len):
                parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
                depths[b, i] = depths[b, parents[b, i]] + 1
        new_mask = tree_attention_mask(parents)
    elif mode == "full":
        new_mask = full_new_mask(batch, q_len, "cpu")
    else:
        new_mask = causal_new_mask(batch, q_len, "cpu")
    positions = prefix[:, None].long() + depths
    to = lambda t: t.to(device)  # noqa: E731
    return dict(q=q, k=k, v=v, page_table=to(page_table), prefix=to(prefix), new=to(new),
                new_mask=to(new_mask.contiguous()), positions=to(positions))


def graph_time_ms(fn, warmup: int, iters: int) -> float | None:
    """Replay of `fn` captured in a CUDA graph: the GPU time without Python launch overhead."""
    try:
        graph, _ = capture_graph(fn)
    except Exception as e:  # noqa: BLE001 - a path that cannot be captured is reported, not fatal
        print(f"  (not capturable: {type(e).__name__}: {str(e)[:100]})", flush=True)
        return None
    ms = cuda_time_ms(graph.replay, warmup, iters)
    del graph
    return ms


def run_case(batch, context, step, args, gen, device) -> dict:
    from blockspec.attention.triton_paged import auto_num_splits, paged_attention

    q_len, mode = STEPS[step]
    c = build_case(batch, context, q_len, mode, args, gen, device)
    scale = 1 / math.sqrt(args.head_dim)
    ps = args.page_size
    window_pos = c["positions"] if args.window is not None else None
    slots = gather_slots(c["page_table"].long(), ps)
    visible = visibility_mask(c["prefix"].long(), c["new"].long(), c["new_mask"], slots.shape[1],
                              args.window, c["positions"])

    def kernel():
        return paged_attention(c["q"], c["k"], c["v"], c["page_table"], c["prefix"], c["new"], scale, ps,
                               mode, new_mask=c["new_mask"] if mode == "tree" else None,
                               sliding_window=args.window, positions=window_pos, num_splits=args.num_splits)

    def reference():
        return masked_attention(c["q"], c["k"][slots], c["v"][slots], visible, scale)

    out = kernel()
    torch.cuda.synchronize()
    exact = masked_attention(c["q"].float(), c["k"].float()[slots], c["v"].float()[slots], visible, scale)
    err = (out.float() - exact).abs().max().item()
    ref_err = (reference().float() - exact).abs().max().item()
    finite = bool(torch.isfinite(out).all())
    del exact

    kernel_ms = cuda_time_ms(kernel, args.warmup, args.iters)
    ref_ms = None if args.no_reference_timing else cuda_time_ms(reference, args.warmup, args.iters)
    graph_ms = graph_time_ms(kernel, args.warmup, args.iters) if args.graph else None
    ref_graph_ms = (graph_time_ms(reference, args.warmup, args.iters)
                    if args.graph and not args.no_reference_timing else None)
    kv_bytes = batch * (context + q_len) * args.kv_heads * args.head_dim * c["k"].element_size() * 2
    splits = args.num_splits or auto_num_splits(c["q"], c["k"], c["page_table"], ps)
    return {
        "batch": batch, "context": context, "step": step, "q_len": q_len, "mask_mode": mode,
        "num_splits": splits, "max_abs_err": err, "reference_bf16_err": ref_err, "finite": finite,
        "ok": finite and err <= args.atol, "kernel_ms": kernel_ms, "reference_ms": ref_ms,
        "speedup": None if ref_ms is None else ref_ms / kernel_ms,
        "kernel_graph_ms": graph_ms, "reference_graph_ms": ref_graph_ms,
        "kv_gbps": kv_bytes / ((graph_ms or kernel_ms) * 1e-3) / 1e9,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}, triton {triton.__version__}, {args.dtype}, "
          f"Hq {args.q_heads} Hkv {args.kv_heads} D {args.head_dim} page {args.page_size}", flush=True)
    header = (f"{'B':>3} {'ctx':>5} {'step':>8} {'splits':>6} {'err':>9} {'ref err':>9} "
              f"{'kernel ms':>10} {'ref ms':>9} {'speedup':>8} {'graph ms':>9} {'ref graph':>9} {'KV GB/s':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    started = time.time()
    for batch in args.batches:
        for context in args.contexts:
            for step in args.steps:
                row = run_case(batch, context, step, args, gen, device)
                rows.append(row)
                ref_ms = "-" if row["reference_ms"] is None else f"{row['reference_ms']:.3f}"
                speed = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
                flag = "" if row["ok"] else "  MISMATCH"
                fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
                print(f"{batch:>3} {context:>5} {step:>8} {row['num_splits']:>6} {row['max_abs_err']:>9.2e} "
                      f"{row['reference_bf16_err']:>9.2e} {row['kernel_ms']:>10.3f} {ref_ms:>9} {speed:>8} "
                      f"{fmt(row['kernel_graph_ms']):>9} {fmt(row['reference_graph_ms']):>9} "
                      f"{row['kv_gbps']:>8.0f}{flag}", flush=True)
                torch.cuda.empty_cache()
    report = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "args": vars(args), "seconds": time.time() - started,
              "all_ok": all(r["ok"] for r in rows), "results": rows}
    with open(args.output, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.output}; all ok: {report['all_ok']}")
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
