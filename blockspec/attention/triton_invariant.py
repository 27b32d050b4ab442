"""Batch-invariant paged attention: a query's output is a function of its own keys alone.

The paged kernel (`triton_paged.py`) picks its query tile, key block and key splits
(flash-decoding) from the verify width and the batch, and lays a tree's keys out in node order,
so the same query at the same position rounds differently in a decode step of width 1, a verify
of width 17, a tree, or beside other rows. Here:

* one program serves one query of one row and one K/V head (its group's query heads, padded
  to `G_PAD ≥ 16`, are the tile's rows);
* the program walks its keys in *position* order, lane n = position n: cached key n for
  n < prefix, then the new token at depth n − prefix on the query's own path (for a tree, the
  ancestor at that depth, `anc [B, Q, Q]`; for causal and full blocks, new token n − prefix);
* keys come in fixed blocks of BLOCK_N positions from position 0, never split, with the same
  tile (BLOCK_N, warps, stages) for every width and batch; lanes the query does not see are
  loaded as zeros.

So the program computes the same floating-point operations on the same values whether the
query is decoded alone, verified in a chain of 17, a tree, or in a batch of 64: the only
inputs are its q row, the K/V at positions 0..its own, and the row's prefix length. Cost: a
verify reads each key once per query (not once per tile), and long contexts at small batch
have no key splits. Under Triton's interpreter (`TRITON_INTERPRET=1`, CPU, float32/float16)
every program's `tl.dot` has the same shapes, so it is reproducible there too.

Sliding windows are not covered (the mode refuses them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from blockspec.attention.triton_paged import LOG2E, MASK_MODES, check_paged_args
# (BLOCK_N, num_warps, num_stages): one key block for every launch.
CUDA_TILE = (64, 4, 2)
INTERPRETER_TILE = (32, 1, 1)


@triton.jit
def _invariant_attn_kernel(
    q_ptr, k_ptr, v_ptr, pt_ptr, prefix_ptr, newlen_ptr, anc_ptr, depth_ptr, out_ptr,
    qk_scale, s_pre, s_new,
    s_qb, s_qq, s_qh, s_qd, s_ks, s_kh, s_kd, s_vs, s_vh, s_vd, s_ptb, s_ptp,
    s_ab, s_aq, s_ae, s_db, s_dq, s_ob, s_oq, s_oh, s_od,
    NUM_KV_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    MASK_MODE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // NUM_KV_HEADS
    kvh = bh % NUM_KV_HEADS
    b64 = b.to(tl.int64)
    prefix = tl.load(prefix_ptr + b64 * s_pre).to(tl.int32)
    new_len = tl.load(newlen_ptr + b64 * s_new).to(tl.int32)

    g = tl.arange(0, G_PAD)
    head = kvh * G + g
    g_ok = g < G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_off = b64 * s_qb + i.to(tl.int64) * s_qq + head[:, None] * s_qh + d[None, :] * s_qd
    q_mask = (g_ok[:, None] & d_ok[None, :]) & (tl.zeros([G_PAD, BLOCK_D], tl.int32) + i < new_len)
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)

    # Positions this query sees: [0, prefix + its depth + 1) (causal, tree) or the whole block (full).
    if MASK_MODE == 0:
        n_hi = prefix + i + 1
    elif MASK_MODE == 1:
        n_hi = prefix + new_len
    else:
        n_hi = prefix + tl.load(depth_ptr + b64 * s_db + i * s_dq).to(tl.int32) + 1
    n_hi = tl.where(i < new_len, n_hi, 0)

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_D], tl.float32)
    for start in range(0, n_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < n_hi
        e = n - prefix                                       # depth among the new tokens
        if MASK_MODE == 2:
            node = tl.load(anc_ptr + b64 * s_ab + i * s_aq + e * s_ae, mask=n_ok & (e >= 0), other=0).to(tl.int32)
        else:
            node = e
        idx = tl.where(e >= 0, prefix + node, n)           # the key's index in the row's pages
        page = tl.load(pt_ptr + b64 * s_ptb + (idx // PAGE_SIZE) * s_ptp, mask=n_ok, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + (idx % PAGE_SIZE)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] * s_ks + kvh * s_kh + d[None, :] * s_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + slot[:, None] * s_vs + kvh * s_vh + d[None, :] * s_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=INPUT_PRECISION) * qk_scale
        qk = tl.where(g_ok[:, None] & n_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    has = (l_i > 0.0) & g_ok
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    o_off = b64 * s_ob + i.to(tl.int64) * s_oq + head[:, None] * s_oh + d[None, :] * s_od
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def tree_ancestors(new_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """new_mask `[B, Q, Q]` (j is i or an ancestor of i; parents before children) →
    (anc `[B, Q, Q]` int32: the node at depth e on i's path, depth `[B, Q]` int32). Device-side
    tensor work only (capturable): ancestors in node order are in depth order."""
    B, Q, _ = new_mask.shape
    m = new_mask.bool()
    rank = m.to(torch.int32).cumsum(-1) - 1                            # depth of each set j
    target = torch.where(m, rank, torch.full_like(rank, Q)).to(torch.int64)   # unset j → spare column
    nodes = torch.arange(Q, dtype=torch.int32, device=m.device).expand(B, Q, Q)
    anc = torch.zeros(B, Q, Q + 1, dtype=torch.int32, device=m.device).scatter_(2, target, nodes)
    depth = (m.sum(-1) - 1).clamp(min=0).to(torch.int32)
    return anc[..., :Q].contiguous(), depth


def invariant_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        page_table: torch.Tensor, prefix_lens: torch.Tensor, new_lens: torch.Tensor,
                        scale: float, page_size: int, mask_mode: str,
                        ancestors: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q `[B, Q, Hq, D]`, k/v cache `[slots, Hkv, D]` of one layer → out `[B, Q, Hq, D]` (q's dtype).

    mask_mode "causal" / "full" as in `triton_paged.paged_attention`; "tree" needs `ancestors`
    = `tree_ancestors(new_mask)`. The new tokens' K/V must be in the cache. Padded queries
    (i ≥ new_len) give zeros.
    """
    B, Q, HQ, D, HKV = check_paged_args(q, k_cache, v_cache, mask_mode)
    mode = MASK_MODES[mask_mode]
    if mode == 2:
        if ancestors is None:
            raise ValueError("tree mode needs ancestors = tree_ancestors(new_mask)")
        anc, depth = ancestors
        if anc.shape != (B, Q, Q) or depth.shape != (B, Q):
            raise ValueError(f"ancestors must be [B, Q, Q] and [B, Q] = {[B, Q, Q]}, {[B, Q]}")
    else:
        anc = depth = prefix_lens                          # unused by the kernel in these modes
    on_cuda = q.device.type == "cuda"
    block_n, warps, stages = CUDA_TILE if on_cuda else INTERPRETER_TILE
    G = HQ // HKV
    out = torch.empty_like(q)
    a_strides = anc.stride() if mode == 2 else (0, 0, 0)
    d_strides = depth.stride() if mode == 2 else (0, 0)
    _invariant_attn_kernel[(Q, B * HKV)](
        q, k_cache, v_cache, page_table, prefix_lens, new_lens, anc, depth, out,
        float(scale) * LOG2E, prefix_lens.stride(0), new_lens.stride(0),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *page_table.stride(),
        *a_strides, *d_strides, *out.stride(),
        NUM_KV_HEADS=HKV, G=G, G_PAD=max(16, triton.next_power_of_2(G)),
        HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_N=block_n, PAGE_SIZE=page_size,
        MASK_MODE=mode, INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages,
    )
    return out


__all__ = ["invariant_attention", "tree_ancestors", "CUDA_TILE", "INTERPRETER_TILE"]
