"""Which paged-attention launches a chain engine's and a DDTree engine's captured decode graphs
hold (mask mode, queries, page-table width, splits), and each graph's kernels in one replay at one
bucket and width 1 and the full width (greedy): why a tree engine's steps, plain ones included,
cost more GPU than a chain engine's (bench/results/gpu_session_q/). CUDA only.

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
    emit(doc, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
