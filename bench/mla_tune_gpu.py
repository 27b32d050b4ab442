"""Time the Triton MLA kernel's tilings (`MLAConfig`) at Kimi K2's shapes on the GPU and report
the best per case beside the latent cache's read time, each tiling checked against the
default's output first. Usage (device machine): python bench/mla_tune_gpu.py --output mla.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from blockspec.attention.triton_mla import MLAConfig, default_config, default_num_splits, mla_config, mla_paged_attention
from blockspec.bench.step import copy_bandwidth

HEADS, LATENT, ROPE = 64, 512, 64


def make_case(batch: int, context: int, q_len: int, page_size: int, gen: torch.Generator):
    per_row = -(-(context + q_len) // page_size)
    rows = torch.randn((batch * per_row + 1) * page_size, LATENT + ROPE, generator=gen).to("cuda", torch.bfloat16)
    page_table = (1 + torch.randperm(batch * per_row, generator=gen)).view(batch, per_row).to("cuda", torch.int32)
    q = torch.randn(batch, q_len, HEADS, LATENT + ROPE, generator=gen).to("cuda", torch.bfloat16)
    prefix = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    new = torch.full((batch,), q_len, dtype=torch.int32, device="cuda")
    return q, rows, page_table, prefix, new


def time_ms(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()   # replays: the kernel's device time without launch gaps
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (iters * 10) * 1e3


def wide_candidates() -> list[MLAConfig]:
    """Tiles of all 64 heads without value splits (the cache read once per key split, the scores
    computed once), their float32 accumulator spread over 8 or 16 warps; and longer key steps."""
    return [MLAConfig(bm, bn, vs, w, st) for bm, bn, vs, w, st in
            [(64, 32, 1, 16, 2), (64, 16, 1, 16, 2), (64, 64, 1, 16, 2), (64, 32, 1, 8, 2), (64, 16, 1, 8, 2),
             (64, 32, 1, 16, 3), (64, 32, 2, 16, 2), (16, 64, 1, 4, 2), (16, 64, 1, 4, 3), (16, 128, 1, 4, 2),
             (16, 64, 1, 8, 2), (32, 64, 1, 8, 2), (16, 32, 1, 4, 3)]]


def candidates() -> list[MLAConfig]:
    """Wide tiles first (they read the cache fewest times), so a sweep cut short by its budget
    has tried the likeliest."""
    out = []
    for bm, vs, bn, w, st in itertools.product((64, 32, 16), (2, 4, 1), (32, 16, 64), (8, 4), (2, 3)):
        acc = bm * LATENT // vs                     # float32 accumulator elements per program
        if acc > 64 * 256 or acc < 16 * 128 or (bn == 64 and bm == 64) or (w == 4 and acc > 16 * 512):
            continue
        out.append(MLAConfig(bm, bn, vs, w, st))
    return out


def sweep_splits(args, cases, data, want, results, scale) -> None:
    """Each case at each key-split count, the default tiling: where whole waves of programs
    (one per SM) make the split count matter (`choose_num_splits`)."""
    counts = [int(x) for x in args.splits.split(",")]
    for name, (b, c, q, p) in cases.items():
        qq, rows, pt, pre, new = data[name]
        chosen = default_num_splits(qq, pt, p, default_config(qq, LATENT))
        row = results["cases"][name]
        row["chosen_splits"], row["splits_ms"] = chosen, {}
        for n in counts:
            fn = lambda: mla_paged_attention(qq, rows, pt, pre, new, scale, p, LATENT, "causal", num_splits=n)  # noqa: E731
            err = float((fn().float() - want[name].float()).abs().max())
            row["splits_ms"][n] = time_ms(fn, args.iters) if err < 5e-2 else f"max err {err}"
        timed = {n: ms for n, ms in row["splits_ms"].items() if isinstance(ms, float)}
        best = min(timed, key=timed.get)
        print(f"{name}: chosen {chosen} splits {row['default_ms']:.3f} ms; best {best} splits {timed[best]:.3f} ms "
              f"(x {timed[best] / row['floor_ms']:.2f} the read); " + " ".join(f"{n}:{ms:.3f}" for n, ms in timed.items()),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--wide", action="store_true", help="only the wide-tile / long-step candidates")
    ap.add_argument("--configs", default=None,
                    help="explicit tilings 'block_m,block_n,v_splits,num_warps,num_stages;…' (instead of a sweep)")
    ap.add_argument("--splits", default=None,
                    help="key-split counts 'a,b,…' to time with the default tiling in every case (instead of tilings)")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    scale = 1.0 / (192 ** 0.5)
    cases = {f"b{b}_ctx{c}_q{q}_p{p}": (b, c, q, p)
             for b, c, q, p in [(16, 32768, 1, 64), (1, 32768, 1, 64), (64, 4096, 1, 64), (16, 4096, 1, 64),
                                (16, 4096, 16, 64), (16, 32768, 1, 16)]}
    data = {name: make_case(b, c, q, p, gen) for name, (b, c, q, p) in cases.items()}
    default = mla_config(LATENT, True)
    results = {"copy_bandwidth_bytes_per_s": bandwidth, "default": default.__dict__, "cases": {}}
    want = {}
    for name, (b, c, q, p) in cases.items():
        qq, rows, pt, pre, new = data[name]
        ref = mla_paged_attention(qq, rows, pt, pre, new, scale, p, LATENT, "causal")
        want[name] = ref
        floor = b * (c + q) * (LATENT + ROPE) * 2 / bandwidth * 1e3
        ms = time_ms(lambda: mla_paged_attention(qq, rows, pt, pre, new, scale, p, LATENT, "causal"), args.iters)
        results["cases"][name] = {"floor_ms": floor, "default_ms": ms, "tried": []}
        print(f"{name}: default {ms:.3f} ms, latent read {floor:.3f} ms (x {ms / floor:.2f})", flush=True)
    if args.splits:
        sweep_splits(args, cases, data, want, results, scale)
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
        return
    start = time.time()
    if args.configs:
        tried = [MLAConfig(*map(int, c.split(","))) for c in args.configs.split(";") if c.strip()]
    else:
        tried = wide_candidates() if args.wide else candidates()
    for cfg in tried:
        if time.time() - start > args.budget_s:
            print("budget spent; stopping the sweep", flush=True)
            break
        for name, (b, c, q, p) in cases.items():
            qq, rows, pt, pre, new = data[name]
            try:
                got = mla_paged_attention(qq, rows, pt, pre, new, scale, p, LATENT, "causal", config=cfg)
                err = float((got.float() - want[name].float()).abs().max())
                ms = time_ms(lambda: mla_paged_attention(qq, rows, pt, pre, new, scale, p, LATENT, "causal",
                                                         config=cfg), args.iters) if err < 5e-2 else None
            except Exception as e:  # noqa: BLE001 - a tiling that does not compile or fit is reported
                err, ms = str(e)[:120], None
            results["cases"][name]["tried"].append({"config": cfg.__dict__, "ms": ms, "max_err": err})
        print(cfg, [r["tried"][-1]["ms"] for r in results["cases"].values()], flush=True)
    for name, r in results["cases"].items():
        timed = [t for t in r["tried"] if t["ms"] is not None]
        if timed:
            best = min(timed, key=lambda t: t["ms"])
            r["best"] = best
            print(f"{name}: best {best['config']} {best['ms']:.3f} ms (x {best['ms'] / r['floor_ms']:.2f} the read; "
                  f"default {r['default_ms']:.3f})")
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
