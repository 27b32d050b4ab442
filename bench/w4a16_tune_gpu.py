"""Time the W4A16 grouped kernel's tilings (`W4A16Config`) at Kimi K2's expert shapes on the GPU,
beside the packed bytes of the experts the rows hit read at this card's copy rate; then the
old K-major layout at the default tiling, to show what the N-major layout buys. Every tiling
is checked against a dequantise-then-matmul reference first.

    python bench/w4a16_tune_gpu.py --output w4a16.json [--budget-s 300]

Rows: a decode batch b routes b · 8 (token, expert) pairs over 384 experts (top-8, distinct per
token): b = 1, 16, 64 → 8, 128, 512 rows."""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from blockspec.bench.step import copy_bandwidth
from blockspec.layers.packed_int import dequantize_packed, n_major
from blockspec.layers.triton_w4a16 import W4A16Config, grouped_matmul, w4a16_config

EXPERTS, TOP_K, HIDDEN, MOE_INTER, GROUP = 384, 8, 7168, 2048, 32


def time_ms(fn, iters: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    reps = 4
    start = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (reps * iters) * 1e3


def make_matrix(n: int, k: int, gen: torch.Generator):
    """Random packed words and bf16 scales for all experts: `[E, N, K/8]`, `[E, N, K/32]` (N-major)."""
    cuda_gen = torch.Generator("cuda").manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
    packed = n_major(torch.randint(-2**31, 2**31 - 1, (EXPERTS, n, k // 8), generator=cuda_gen, device="cuda",
                                   dtype=torch.int32))
    scale = n_major((torch.rand(EXPERTS, n, k // GROUP, generator=gen) * 0.02 + 0.001).to("cuda", torch.bfloat16))
    return packed, scale


def make_rows(batch: int, k: int, gen: torch.Generator):
    ids = torch.rand(batch, EXPERTS, generator=gen).topk(TOP_K, dim=-1)[1].flatten()
    counts = torch.bincount(ids, minlength=EXPERTS)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32).cuda()
    x = (torch.randn(ids.numel(), k, generator=gen) * 0.5).to("cuda", torch.bfloat16)
    return x, offsets, int((counts > 0).sum())


def reference(x, packed, scale, offsets, k):
    out, offs = [], offsets.tolist()
    for e in range(EXPERTS):
        if offs[e + 1] > offs[e]:
            w = dequantize_packed(packed[e], scale[e], k, GROUP).to(torch.bfloat16)
            out.append((x[offs[e]:offs[e + 1]].float() @ w.float().T))
    return torch.cat(out)


def candidates() -> list[W4A16Config]:
    """Around the first sweep's winners (256 columns, 16 words, 4 warps, 3 stages)."""
    return [W4A16Config(16, bn, kw, w, st) for bn, kw, w, st in
            itertools.product((256, 128, 512), (16, 32), (4, 8), (3, 4, 2))
            if not (bn == 512 and w == 4) and not (bn == 512 and kw == 32)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    result = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bandwidth, "cases": {}}
    matrices = {"gate_up": (2 * MOE_INTER, HIDDEN), "down": (HIDDEN, MOE_INTER)}
    weights = {name: make_matrix(n, k, gen) for name, (n, k) in matrices.items()}
    cases = []
    for batch in (1, 16, 64):
        for name, (n, k) in matrices.items():
            x, offsets, hit = make_rows(batch, k, gen)
            cases.append((f"{name}_b{batch}", name, n, k, x, offsets, hit))
    cands = candidates()
    t0 = time.perf_counter()          # the budget is the sweep's, after the set-up
    for case, name, n, k, x, offsets, hit in cases:
        packed, scale = weights[name]
        ref = reference(x, packed, scale, offsets, k)
        per_expert = packed[0].numel() * 4 + scale[0].numel() * 2
        floor = hit * per_expert / bandwidth * 1e3
        default = w4a16_config(x.shape[0], True)
        entry = {"rows": x.shape[0], "experts_hit": hit, "floor_ms": floor, "default": default.__dict__, "tried": []}
        kmajor = (packed.contiguous(), scale.contiguous())
        entry["k_major_default_ms"] = time_ms(lambda: grouped_matmul(x, *kmajor, offsets, GROUP))
        for cfg in [default] + [c for c in cands if c != default]:
            if cfg != default and time.perf_counter() - t0 > args.budget_s * (len(result["cases"]) + 1) / len(cases):
                break
            try:
                out = grouped_matmul(x, packed, scale, offsets, GROUP, config=cfg)
                err = ((out.float() - ref).abs() / (1 + ref.abs())).max().item()
                ms = time_ms(lambda: grouped_matmul(x, packed, scale, offsets, GROUP, config=cfg))
            except Exception as e:   # noqa: BLE001 - a tiling the compiler refuses is reported
                entry["tried"].append({"config": cfg.__dict__, "error": str(e)[:200]})
                continue
            entry["tried"].append({"config": cfg.__dict__, "ms": ms, "max_rel_err": err})
        ok = [t for t in entry["tried"] if "ms" in t and t["max_rel_err"] < 2e-2]
        best = min(ok, key=lambda t: t["ms"])
        entry["best"] = best
        entry["default_ms"] = entry["tried"][0].get("ms")
        result["cases"][case] = entry
        print(f"{case}: rows {x.shape[0]} hit {hit} floor {floor:.3f} ms | K-major {entry['k_major_default_ms']:.3f} "
              f"| default {entry['default_ms']:.3f} (err {entry['tried'][0].get('max_rel_err', -1):.1e}) "
              f"| best {best['ms']:.3f} ×{best['ms'] / floor:.2f} {best['config']} ({len(entry['tried'])} tried)",
              flush=True)
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
