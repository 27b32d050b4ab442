"""Fused pointwise kernels (blockspec.layers.triton_ops) on CUDA: bit-exactness against the eager
layers at real shapes, and time against them. Standalone: `python bench/triton_ops_gpu.py
--output out.json` from the repository root (needs a GPU, torch and triton).

Exactness: RMSNorm (hidden and q/k-norm rows), residual add + RMSNorm, RoPE of q and k, silu·mul,
in bfloat16 (and float16 / float32), for 1, 16 and 64×17 tokens at hidden 4096, 32 query and 8
K/V heads of 128; plus a sweep of RMSNorm widths × row counts, since ATen's reduction order
(which the kernel reproduces) changes with both. Each case records how many elements differ
(0 is the claim).

Time: each op alone, eager (the layers' code) against fused, as the median over replays of a
CUDA graph holding `--reps` repetitions (and over plain launch loops, which include Python's
launch overhead), per repetition, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from cuda_timing import capture_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockspec.layers import triton_ops, triton_reduction  # noqa: E402
from blockspec.layers.norm import rms_norm_reference  # noqa: E402
from blockspec.layers.rope import apply_rope  # noqa: E402

EPS = 1e-6
HIDDEN, HQ, HKV, HEAD_DIM, INTER = 4096, 32, 8, 128, 14336
TOKENS = {"1": (1, 1), "16": (16, 1), "64x17": (64, 17)}   # (batch, tokens a row)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def rand(*shape, dtype, scale=1.0, offset=0.0, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=gen, device="cuda") * scale + offset).to(dtype)


def cos_sin(B, T, dtype, seed):
    pos = torch.randint(0, 32768, (B, T), device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
    inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    freqs = pos.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def differ(out, ref) -> dict:
    same_shape = out.shape == ref.shape and out.dtype == ref.dtype
    n = int((out != ref).sum().item()) if same_shape else -1
    return {"mismatches": n, "numel": ref.numel(),
            "max_abs_diff": float((out.float() - ref.float()).abs().max().item()) if same_shape else None}


def cases(dtype, B, T):
    """(name, eager fn, fused fn) for one dtype and token layout, with their inputs bound."""
    M = B * T
    x = rand(M, HIDDEN, dtype=dtype, scale=2.0, seed=1)
    res = rand(M, HIDDEN, dtype=dtype, scale=4.0, seed=2)
    w = rand(HIDDEN, dtype=dtype, scale=0.1, offset=1.0, seed=3)
    q = rand(B, T, HQ, HEAD_DIM, dtype=dtype, scale=3.0, seed=4)
    k = rand(B, T, HKV, HEAD_DIM, dtype=dtype, scale=3.0, seed=5)
    wq = rand(HEAD_DIM, dtype=dtype, scale=0.1, offset=1.0, seed=6)
    cos, sin = cos_sin(B, T, dtype, seed=7)
    gate = rand(M, INTER, dtype=dtype, scale=3.0, seed=8)
    up = rand(M, INTER, dtype=dtype, seed=9)

    def add_norm_eager():
        s = x + res
        return rms_norm_reference(s, w, EPS), s

    fused = triton_ops.rms_norm_is_fused
    return [  # (name, eager, fused, whether the fused call really runs a kernel)
        ("rms_norm[hidden]", lambda: rms_norm_reference(x, w, EPS), lambda: triton_ops.rms_norm(x, w, EPS),
         fused(x, w)),
        ("rms_norm[q_heads]", lambda: rms_norm_reference(q, wq, EPS), lambda: triton_ops.rms_norm(q, wq, EPS),
         fused(q, wq)),
        ("rms_norm[k_heads]", lambda: rms_norm_reference(k, wq, EPS), lambda: triton_ops.rms_norm(k, wq, EPS),
         fused(k, wq)),
        ("add_rms_norm", add_norm_eager, lambda: triton_ops.add_rms_norm(x, res, w, EPS), fused(x, w, res)),
        ("rope_qk", lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
         lambda: triton_ops.apply_rope_qk(q, k, cos, sin), True),
        ("silu_mul", lambda: torch.nn.functional.silu(gate) * up, lambda: triton_ops.silu_mul(gate, up), True),
    ]


def flat(out):
    return list(out) if isinstance(out, tuple) else [out]


def check_exactness(dtypes) -> list[dict]:
    results = []
    for dname in dtypes:
        for tname, (B, T) in TOKENS.items():
            for name, eager, fused, kernel in cases(DTYPES[dname], B, T):
                entry = {"op": name, "dtype": dname, "tokens": tname, "kernel_ran": kernel}
                try:
                    diffs = [differ(a, b) for a, b in zip(flat(fused()), flat(eager()))]
                    entry["mismatches"] = sum(d["mismatches"] for d in diffs)
                    entry["numel"] = sum(d["numel"] for d in diffs)
                    entry["max_abs_diff"] = max(d["max_abs_diff"] or 0.0 for d in diffs)
                except Exception as e:  # keep going: record the failure
                    entry["error"] = f"{type(e).__name__}: {e}"
                results.append(entry)
                print(f"exact  {name:18s} {dname:9s} tokens={tname:6s} "
                      f"{entry.get('mismatches', entry.get('error'))} differ"
                      + ("" if kernel else "  (eager fallback: no kernel ran)"), flush=True)
    return results


SWEEP_WIDTHS = [96, 128, 1000, 1536, 2048, 4096, 5120, 8192]
SWEEP_ROWS = [1, 2, 3, 16, 17, 64, 1088]


def reduction_sweep(dtype_names) -> list[dict]:
    """RMSNorm over widths × rows: mismatches of the full op, and of the mean alone (the sum in
    ATen's order times the factor, against `pow(2).mean(-1)`), to tell the reduction from the
    rest when something differs."""
    out = []
    for dname in dtype_names:
        dtype = DTYPES[dname]
        for n in SWEEP_WIDTHS:
            for rows in SWEEP_ROWS:
                entry = {"dtype": dname, "rows": rows, "width": n}
                try:
                    x = rand(rows, n, dtype=dtype, scale=2.0, seed=rows * 7919 + n)
                    w = rand(n, dtype=dtype, scale=0.1, offset=1.0, seed=n)
                    entry["kernel_ran"] = triton_ops.rms_norm_is_fused(x, w)
                    entry["rms_norm"] = differ(triton_ops.rms_norm(x, w, EPS), rms_norm_reference(x, w, EPS))["mismatches"]
                    xf = x.float()
                    mean = xf.pow(2).mean(-1)
                    factor = torch.tensor(triton_ops._mean_factor(rows, n), device="cuda")
                    variant = triton_ops.cuda_order_variant()
                    if variant is not None and triton_reduction.cuda_reduce_plan(rows, n, variant[0]) is not None:
                        ss = triton_ops.row_sum_of_squares(xf, "cuda", variant)
                        entry["mean"] = differ(ss * factor, mean)["mismatches"]
                    # which modelled orders reproduce torch here (diagnosis)
                    entry["matching_variants"] = [
                        v for v in triton_reduction.CUDA_ORDER_VARIANTS
                        if triton_reduction.cuda_reduce_plan(rows, n, v[0]) is not None
                        and torch.equal(triton_reduction.cuda_order_sum_reference(xf * xf, v) * factor, mean)]
                except Exception as e:
                    entry["error"] = f"{type(e).__name__}: {e}"
                out.append(entry)
        bad = [e for e in out if e["dtype"] == dname and (e.get("rms_norm") or e.get("mean") or "error" in e)]
        print(f"sweep  {dname}: {len(SWEEP_WIDTHS) * len(SWEEP_ROWS)} shapes, {len(bad)} with differences"
              + "".join(f"\n       {e}" for e in bad[:20]), flush=True)
    return out


def diagnostics() -> dict:
    """The elementwise building blocks alone, over a wide range of inputs: libdevice's rsqrt and
    exp against torch's (the kernels' premise on CUDA)."""
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def unary(x_ptr, o_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
        if OP == 0:
            y = libdevice.rsqrt(x)
        elif OP == 1:
            y = tl.math.rsqrt(x)
        elif OP == 2:
            y = libdevice.exp(x)
        elif OP == 3:
            y = tl.exp(x)
        else:
            y = tl.div_rn(x, 1.0 + libdevice.exp(-x))
        tl.store(o_ptr + offs, y, mask=offs < n)

    def run(x, op, fusion=False):
        o = torch.empty_like(x)
        unary[(triton.cdiv(x.numel(), 1024),)](x, o, x.numel(), OP=op, BLOCK=1024, enable_fp_fusion=fusion)
        return o

    pos = torch.logspace(-7, 4, 1 << 20, device="cuda")
    ex = torch.linspace(-90, 90, 1 << 20, device="cuda")
    return {
        "rsqrt_libdevice_vs_torch": differ(run(pos, 0), torch.rsqrt(pos)),
        "rsqrt_tl_math_vs_torch": differ(run(pos, 1), torch.rsqrt(pos)),
        "exp_libdevice_vs_torch": differ(run(ex, 2), torch.exp(ex)),
        "exp_tl_vs_torch": differ(run(ex, 3), torch.exp(ex)),
        "silu_libdevice_vs_torch": differ(run(ex, 4), torch.nn.functional.silu(ex)),
        "silu_libdevice_fp_fusion_vs_torch": differ(run(ex, 4, True), torch.nn.functional.silu(ex)),
    }


def time_graph(fn, reps, replays) -> float:
    """Median µs per call over `replays` replays of a graph of `reps` calls."""
    graph, _ = capture_graph(fn, reps)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(times)


def time_loop(fn, reps, replays) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / reps)
    return statistics.median(times)


def timing(dtype_name, reps, replays) -> list[dict]:
    out = []
    for tname, (B, T) in TOKENS.items():
        for name, eager, fused, kernel in cases(DTYPES[dtype_name], B, T):
            entry = {"op": name, "dtype": dtype_name, "tokens": tname, "kernel_ran": kernel}
            try:
                entry["eager_graph_us"] = time_graph(eager, reps, replays)
                entry["fused_graph_us"] = time_graph(fused, reps, replays)
                entry["eager_loop_us"] = time_loop(eager, reps, replays)
                entry["fused_loop_us"] = time_loop(fused, reps, replays)
                entry["graph_speedup"] = entry["eager_graph_us"] / entry["fused_graph_us"]
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
            print(f"time   {name:18s} {dtype_name} tokens={tname:6s} "
                  + (f"graph {entry['eager_graph_us']:7.2f} → {entry['fused_graph_us']:7.2f} µs, "
                     f"loop {entry['eager_loop_us']:7.2f} → {entry['fused_loop_us']:7.2f} µs"
                     if "error" not in entry else entry["error"]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", required=True, help="JSON file to write")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--reps", type=int, default=36, help="calls captured in one CUDA graph")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--sweep-dtypes", default="bfloat16,float32")
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    import triton
    dtypes = args.dtypes.split(",")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shapes": {"hidden": HIDDEN, "q_heads": HQ, "kv_heads": HKV, "head_dim": HEAD_DIM,
                         "intermediate": INTER, "tokens": TOKENS}}
    report["cuda_order_variant"] = triton_ops.cuda_order_variant()
    print(f"ATen reduction order variant (vec_min, warp_halving): {report['cuda_order_variant']}", flush=True)
    sections = [("diagnostics", diagnostics), ("exactness", lambda: check_exactness(dtypes))]
    if not args.skip_sweep:
        sections.append(("reduction_sweep", lambda: reduction_sweep(args.sweep_dtypes.split(","))))
    if not args.skip_timing:
        sections.append(("timing", lambda: timing(dtypes[0], args.reps, args.replays)))
    for key, fn in sections:
        try:
            report[key] = fn()
        except Exception:
            report[key] = {"error": traceback.format_exc()}
            print(report[key]["error"], flush=True)
        Path(args.output).write_text(json.dumps(report, indent=1, default=str))
    exact = report.get("exactness", [])
    report["all_exact"] = isinstance(exact, list) and all(e.get("mismatches") == 0 for e in exact)
    report["all_fused"] = isinstance(exact, list) and all(e.get("kernel_ran") for e in exact)
    Path(args.output).write_text(json.dumps(report, indent=1, default=str))
    print(f"all exact: {report['all_exact']}; all ran the kernel: {report['all_fused']}; wrote {args.output}")


if __name__ == "__main__":
    main()
