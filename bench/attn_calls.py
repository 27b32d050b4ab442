"""Which paged-attention launches a chain engine's and a DDTree engine's captured decode graphs
hold (mask mode, queries, page-table width, splits), and each graph's kernels in one replay at one
bucket and width 1 and the full width (greedy): why a tree engine's steps, plain ones included,
cost more GPU than a chain engine's (bench/results/gpu_session_q/). Then the bundled target's
paged attention alone at real contexts (`mask_cost`): causal against a tree mask (a chain's and a
bushy tree's), since the graph replays run on capture inputs without a cached context. CUDA only
(`mask_cost` runs anywhere: `python -c "from bench.attn_calls import mask_cost; ..."`).

    python bench/attn_calls.py --batch 16 --output /tmp/attn_calls.json
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import blockspec.attention.triton_backend as triton_backend  # noqa: E402
from blockspec.attention.triton_paged import auto_num_splits  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from graph_split import BUNDLED, emit, kernel_table  # noqa: E402


def mask_cost(batch: int = 16, width: int = 16, contexts=(0, 256, 1024), reps: int = 50,
              device: str = "cuda", dtype=torch.bfloat16, heads: int = 5, kv_heads: int = 1, head_dim: int = 64,
              page_size: int = 16) -> dict:
    """ms per `paged_attention` call at each cached context: causal, a chain's tree mask, a
    bushy tree's mask (each node's parent (i − 1) // 2)."""
    import time
    from blockspec.attention.triton_paged import pack_tree_mask, paged_attention
    from blockspec.speculative.tree import tree_attention_mask
    g = torch.Generator().manual_seed(0)
    out = {}
    for ctx in contexts:
        pages = (ctx + width) // page_size + 1
        slots = batch * pages * page_size
        k = torch.randn(slots, kv_heads, head_dim, generator=g).to(device, dtype)
        v = torch.randn(slots, kv_heads, head_dim, generator=g).to(device, dtype)
        q = torch.randn(batch, width, heads, head_dim, generator=g).to(device, dtype)
        table = torch.arange(batch * pages, device=device).view(batch, pages)
        prefix = torch.full((batch,), ctx, device=device)
        new = torch.full((batch,), width, device=device)
        node = torch.arange(width)
        # Packed once, outside the timing, as the backend packs once a forward for all layers.
        chain = pack_tree_mask(tree_attention_mask((node - 1).expand(batch, -1)).to(device))
        bushy = pack_tree_mask(tree_attention_mask(torch.where(node > 0, (node - 1) // 2, -1).expand(batch, -1)).to(device))
        row, outputs = {}, {}
        for name, mode, mask in (("causal", "causal", None), ("tree_chain", "tree", chain), ("tree_bushy", "tree", bushy)):
            call = lambda: paged_attention(q, k, v, table, prefix, new, 0.125, page_size, mode, mask)  # noqa: E731
            outputs[name] = call()
            if device == "cuda":
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    call()
                end.record()
                end.synchronize()
                row[name] = round(start.elapsed_time(end) / reps, 4)
            else:
                begin = time.perf_counter()
                for _ in range(reps):
                    call()
                row[name] = round((time.perf_counter() - begin) / reps * 1e3, 4)
        # A chain's tree mask is the causal one: the same attention (a check beside the timing).
        row["chain_vs_causal_max_diff"] = float((outputs["tree_chain"].float() - outputs["causal"].float()).abs().max())
        out[f"context {ctx}"] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    calls = collections.Counter()
    inner = triton_backend.paged_attention

    def recorded(q, k_cache, v_cache, page_table, prefix_lens, new_lens, scale, page_size, mask_mode, *rest, **kw):
        calls[(mask_mode, tuple(q.shape), tuple(page_table.shape), page_size,
               auto_num_splits(q, k_cache, page_table, page_size))] += 1
        return inner(q, k_cache, v_cache, page_table, prefix_lens, new_lens, scale, page_size, mask_mode, *rest, **kw)
    triton_backend.paged_attention = recorded
    doc = {"device": torch.cuda.get_device_name()}
    common = dict(device="cuda", dtype="bfloat16", max_running_requests=args.batch, draft_model=str(BUNDLED / "drafter"))
    for name, kw in (("chain", dict(spec="dflash")), ("tree", dict(spec="ddtree", tree_budget=15))):
        calls.clear()
        engine = LLM(str(BUNDLED / "target"), **common, **kw).engine
        doc[name + "_attention_calls"] = [[*k, n] for k, n in sorted(calls.items(), key=lambda kv: -kv[1])[:12]]
        doc[name + "_cache_k"] = list(engine.cache.k.shape)
        for w in (1, max(engine.graphed.by_width)):
            doc[f"{name}_w{w}_kernels"] = kernel_table(engine, args.batch, w, "greedy", top=14)
        del engine
        torch.cuda.empty_cache()
    doc["mask_cost_ms"] = mask_cost(args.batch)
    emit(doc, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
