"""Triton paged attention over the K/V cache: decode, chain/tree verify, DFlash blocks, prefill.

Semantics are those of `reference.masked_attention` over `metadata.visibility_mask` (see
docs/design.md, "Paged attention"): query i (< new_len) of row b sees cached key j < prefix_len
and new key r (position prefix_len + r, r < new_len) when the mask mode allows it, optionally
restricted to a sliding window. The new tokens' K/V must already be in the cache.

Layout: one program handles one (query tile, row, K/V head, key split). The query heads of the
K/V head's group are flattened with the queries into the tile's M dimension (row m is query
`m // G_PAD`, group head `m % G_PAD`), so K/V is read once per group, straight from the pages
(per-key slot through the page table, any page size). Online softmax in float32 (exp2 domain).
With several key splits (flash-decoding) each program writes a normalized partial output and
its log-sum-exp, and a second kernel combines them.

Tree masks arrive packed (`pack_tree_mask`): one 32-bit word per query and 32 new keys, so a
block of 32 new keys costs one load per query row, not a byte gather per (query, key) pair (the
gather made a tree-masked call 1.1–1.7× a causal one on an H100 at width 16). The new keys are
then their own loop of word-aligned 32-key blocks, after the cached keys; a tree node's
ancestors precede it (parents have smaller indices), so a query tile reads no new key past its
last query, as under the causal mask.

The module also runs under Triton's interpreter (`TRITON_INTERPRET=1` set before import) on CPU
tensors; there, use float32/float16 (bfloat16 loads are wrong under the 3.x interpreter).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MASK_MODES = {"causal": 0, "full": 1, "tree": 2}
# The paged kernel's own mode for tree masks packed into visibility bits (`pack_tree_mask`).
_TREE_BITS = 3
BITS_PER_WORD = 32
LOG2E = 1.4426950408889634
_DEFAULT_SMS = 132


@triton.jit
def _visible(n, n_ok, prefix, qi, row_valid, mask_ptr, b64, s_mb, s_mi, s_mr, MASK_MODE: tl.constexpr):
    """`[rows, keys]` which keys `n` the query rows `qi` see: every cached key (below `prefix`),
    and of the new ones the causal, full or tree-ancestor (mask `[b, i, j]`) set. Also per key:
    its offset among the new tokens, and whether it is cached / new."""
    r = n - prefix
    is_cached = n < prefix
    is_new = (r >= 0) & n_ok
    if MASK_MODE == 0:
        new_vis = r[None, :] <= qi[:, None]
    elif MASK_MODE == 1:
        new_vis = r[None, :] >= 0
    else:
        mk = tl.load(mask_ptr + b64 * s_mb + qi[:, None] * s_mi + r[None, :] * s_mr,
                     mask=row_valid[:, None] & is_new[None, :], other=0)
        new_vis = mk != 0
    vis = (is_cached[None, :] & n_ok[None, :]) | (is_new[None, :] & new_vis)
    return vis, r, is_cached, is_new


@triton.jit
def _attend_block(q, acc, m_i, l_i, start, hi, prefix, qi, qpos, row_valid, window, qk_scale,
                  k_ptr, v_ptr, pt_ptr, mask_ptr, pos_ptr, b64, kvh, d, d_ok,
                  s_ks, s_kh, s_kd, s_vs, s_vh, s_vd, s_ptb, s_ptp, s_mb, s_mi, s_mr, s_posb, s_posq,
                  BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, MASK_MODE: tl.constexpr,
                  USE_WINDOW: tl.constexpr, CACHED_ONLY: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One block of keys [start, start + BLOCK_N) into the online softmax. CACHED_ONLY: the
    block lies wholly below prefix and hi, so only the window can hide a key (padded query rows
    are zeroed at the end)."""
    n = start + tl.arange(0, BLOCK_N)
    n_ok = n < hi
    if CACHED_ONLY:
        page = tl.load(pt_ptr + b64 * s_ptb + (n // PAGE_SIZE) * s_ptp)
    else:
        page = tl.load(pt_ptr + b64 * s_ptb + (n // PAGE_SIZE) * s_ptp, mask=n_ok, other=0)
    slot = page.to(tl.int64) * PAGE_SIZE + (n % PAGE_SIZE)
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + slot[:, None] * s_ks + kvh * s_kh + d[None, :] * s_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + slot[:, None] * s_vs + kvh * s_vh + d[None, :] * s_vd, mask=kv_mask, other=0.0)

    qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=INPUT_PRECISION) * qk_scale

    if CACHED_ONLY:
        if USE_WINDOW:
            qk = tl.where((qpos[:, None] - n[None, :]) < window, qk, float("-inf"))
    else:
        if MASK_MODE == 3:
            # Packed tree: a block holding new keys is BITS_PER_WORD of them from a word boundary
            # (the kernel's new-key loop); blocks of cached keys load no word.
            r = n - prefix
            is_cached = r < 0
            is_new = (r >= 0) & n_ok
            word = tl.load(mask_ptr + b64 * s_mb + qi * s_mi + ((start - prefix) // 32) * s_mr,
                           mask=row_valid & ((qi * 0 + start) >= prefix), other=0)
            bit = (word[:, None] >> (r & 31)[None, :]) & 1
            vis = (is_cached[None, :] & n_ok[None, :]) | (is_new[None, :] & (bit != 0))
        else:
            vis, r, is_cached, is_new = _visible(n, n_ok, prefix, qi, row_valid, mask_ptr, b64, s_mb, s_mi, s_mr,
                                                 MASK_MODE)
        if USE_WINDOW:
            kpos_new = tl.load(pos_ptr + b64 * s_posb + r * s_posq, mask=is_new, other=0).to(tl.int32)
            kpos = tl.where(is_cached, n, kpos_new)
            vis = vis & ((qpos[:, None] - kpos[None, :]) < window)
        vis = vis & row_valid[:, None]
        qk = tl.where(vis, qk, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _paged_attn_kernel(
    q_ptr, k_ptr, v_ptr, pt_ptr, prefix_ptr, newlen_ptr, mask_ptr, pos_ptr,
    out_ptr, opart_ptr, lse_ptr,
    qk_scale, window, Q, P,
    s_pre, s_new,
    s_qb, s_qq, s_qh, s_qd,
    s_ks, s_kh, s_kd,
    s_vs, s_vh, s_vd,
    s_ptb, s_ptp,
    s_mb, s_mi, s_mr,
    s_posb, s_posq,
    s_ob, s_oq, s_oh, s_od,
    NUM_KV_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    MASK_MODE: tl.constexpr, USE_WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // G_PAD
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // NUM_KV_HEADS
    kvh = bh % NUM_KV_HEADS
    b64 = b.to(tl.int64)

    prefix = tl.load(prefix_ptr + b64 * s_pre).to(tl.int32)
    new_len = tl.load(newlen_ptr + b64 * s_new).to(tl.int32)
    total = prefix + new_len

    # Tile rows: query index i, head of the group g.
    m = tl.arange(0, BLOCK_M)
    q_start = tile * BLOCK_Q
    qi = q_start + m // G_PAD
    g = m % G_PAD
    head = kvh * G + g
    row_in = (qi < Q) & (g < G)          # rows that exist in q / out
    row_valid = (qi < new_len) & (g < G)  # rows that attend

    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_off = b64 * s_qb + qi.to(tl.int64)[:, None] * s_qq + head[:, None] * s_qh + d[None, :] * s_qd
    q = tl.load(q_ptr + q_off, mask=row_valid[:, None] & d_ok[None, :], other=0.0)

    # Key range [lo, hi) this tile can see.
    hi = total
    if MASK_MODE == 0:
        hi = prefix + tl.minimum(q_start + BLOCK_Q, new_len)
    if MASK_MODE == 3:
        hi = prefix                     # the new keys are the loop after the cached ones
    lo = 0
    qpos = qi
    if USE_WINDOW:
        qpos = tl.load(pos_ptr + b64 * s_posb + qi * s_posq, mask=row_valid, other=0).to(tl.int32)
        qpos_min = tl.min(tl.where(row_valid, qpos, 2147483647), axis=0)
        # Cached key j is visible only when j > qpos − window; new keys are never skipped.
        lo = tl.maximum(tl.minimum(qpos_min - window + 1, prefix), 0)
    hi = tl.where(q_start >= new_len, lo, hi)   # a tile of padded queries reads nothing
    # This program's share of [lo, hi), in whole blocks.
    if NUM_SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = lo + split * chunk
        hi = tl.minimum(hi, lo + chunk)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Whole blocks of cached keys need no mask but the window's; the rest (the last partial
    # cached block and the new tokens, ≤ a few blocks unless prefilling) the full visibility.
    mid = lo + tl.maximum(tl.minimum(prefix, hi) - lo, 0) // BLOCK_N * BLOCK_N
    for start in range(lo, mid, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            q, acc, m_i, l_i, start, hi, prefix, qi, qpos, row_valid, window, qk_scale,
            k_ptr, v_ptr, pt_ptr, mask_ptr, pos_ptr, b64, kvh, d, d_ok,
            s_ks, s_kh, s_kd, s_vs, s_vh, s_vd, s_ptb, s_ptp, s_mb, s_mi, s_mr, s_posb, s_posq,
            BLOCK_N, PAGE_SIZE, MASK_MODE, USE_WINDOW, True, INPUT_PRECISION)
    for start in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            q, acc, m_i, l_i, start, hi, prefix, qi, qpos, row_valid, window, qk_scale,
            k_ptr, v_ptr, pt_ptr, mask_ptr, pos_ptr, b64, kvh, d, d_ok,
            s_ks, s_kh, s_kd, s_vs, s_vh, s_vd, s_ptb, s_ptp, s_mb, s_mi, s_mr, s_posb, s_posq,
            BLOCK_N, PAGE_SIZE, MASK_MODE, USE_WINDOW, False, INPUT_PRECISION)
    if MASK_MODE == 3:
        # New keys up to the tile's last query (a node sees only earlier nodes), all in the
        # last split, in word-aligned blocks.
        new_hi = tl.where(q_start >= new_len, 0, tl.minimum(q_start + BLOCK_Q, new_len))
        new_end = tl.where(split == NUM_SPLITS - 1, prefix + new_hi, prefix)
        for start in range(prefix, new_end, 32):
            acc, m_i, l_i = _attend_block(
                q, acc, m_i, l_i, start, new_end, prefix, qi, qpos, row_valid, window, qk_scale,
                k_ptr, v_ptr, pt_ptr, mask_ptr, pos_ptr, b64, kvh, d, d_ok,
                s_ks, s_kh, s_kd, s_vs, s_vh, s_vd, s_ptb, s_ptp, s_mb, s_mi, s_mr, s_posb, s_posq,
                32, PAGE_SIZE, MASK_MODE, USE_WINDOW, False, INPUT_PRECISION)

    has = (l_i > 0.0) & row_valid           # padded queries give zeros
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    o_mask = row_in[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        o_off = b64 * s_ob + qi.to(tl.int64)[:, None] * s_oq + head[:, None] * s_oh + d[None, :] * s_od
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # Partials: o [B, Q, Hq, S, D], lse [B, Q, Hq, S] (log2 domain), contiguous.
        HQ: tl.constexpr = NUM_KV_HEADS * G
        rowid = (b64 * Q + qi.to(tl.int64)) * HQ + head
        tl.store(opart_ptr + (rowid * NUM_SPLITS + split)[:, None] * HEAD_DIM + d[None, :], out, mask=o_mask)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + rowid * NUM_SPLITS + split, lse, mask=row_in)


@triton.jit
def _combine_kernel(opart_ptr, lse_ptr, out_ptr, Q, s_ob, s_oq, s_oh, s_od,
                    HQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)          # (b * Q + i) * HQ + h
    h = row % HQ
    bi = row // HQ
    i = bi % Q
    b = bi // Q
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    lse = tl.load(lse_ptr + row * NUM_SPLITS + s, mask=s_ok, other=float("-inf"))
    mx = tl.max(lse, axis=0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    o = tl.load(opart_ptr + (row * NUM_SPLITS + s)[:, None] * HEAD_DIM + d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    den = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(den > 0.0, den, 1.0)
    tl.store(out_ptr + b * s_ob + i * s_oq + h * s_oh + d * s_od, res.to(out_ptr.dtype.element_ty), mask=d_ok)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_SMS


def _config(q_len: int, g_pad: int, head_dim: int, on_cuda: bool, elem_size: int = 2) -> tuple[int, int, int, int]:
    """BLOCK_M, BLOCK_N, num_warps, num_stages.

    Picked on an H200 (bf16, D 128, Triton 3.6; see bench/triton_attention_gpu.py): decode tiles
    (M 16) like long key blocks, M 64 short ones, M 128 long ones with 8 warps. 4-byte inputs
    and D > 128 use smaller key blocks to stay within shared memory.
    """
    cap = 128 if head_dim <= 128 else 64
    block_m = max(16, g_pad, min(cap, triton.next_power_of_2(q_len * g_pad)))
    if not on_cuda:
        return block_m, 64, 1, 1
    if head_dim > 128:
        return block_m, 32, 4 if block_m <= 64 else 8, 2
    if elem_size > 2:
        return block_m, 64 if block_m <= 64 else 32, 4 if block_m <= 64 else 8, 2
    if block_m <= 32:
        return block_m, 128, 4, 2
    if block_m <= 64:
        return block_m, 32, 4, 2
    return block_m, 128, 8, 3


# A program's fixed cost (its query tile's load, its partial's write and combine), in keys'
# worth of work: the ~256 keys below which a split is not worth making.
SPLIT_OVERHEAD_KEYS = 256


def choose_num_splits(batch: int, kv_heads: int, q_tiles: int, max_keys: int, q_len: int,
                      num_sms: int = _DEFAULT_SMS, programs_per_sm: int = 0) -> int:
    """Key splits so that a short-Q launch fills ~2 waves of SMs; 1 for long Q or short contexts.

    `max_keys` is the page-table capacity (P · page_size), a static bound: no host sync. A split
    gets at least ~256 keys, at most 64 splits. `programs_per_sm` > 0: how many programs fit an
    SM at once (a kernel whose shared memory fills the SM: 1). Waves are then whole, so the
    splits minimise waves × (a split's keys + SPLIT_OVERHEAD_KEYS), fewest splits on a tie: 17
    splits of 16 rows are 272 programs, three waves of one program per SM on 132 SMs, where 8
    splits take one.
    """
    if q_len > 256:
        return 1
    programs = max(batch * kv_heads * q_tiles, 1)
    cap = int(max(1, min(max_keys // 256, 64)))
    if programs_per_sm > 0:
        slots = num_sms * programs_per_sm
        return min(range(1, cap + 1),
                   key=lambda s: (triton.cdiv(programs * s, slots) * (max_keys / s + SPLIT_OVERHEAD_KEYS), s))
    want = triton.cdiv(2 * num_sms, programs)
    return int(max(1, min(want, cap)))


def check_paged_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     mask_mode: str) -> tuple[int, int, int, int, int]:
    """The shape checks every paged-attention kernel shares; returns B, Q, Hq, D, Hkv."""
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {sorted(MASK_MODES)}, got {mask_mode!r}")
    B, Q, HQ, D = q.shape
    HKV = k_cache.shape[1]
    if HQ % HKV:
        raise ValueError(f"{HQ} query heads are not a multiple of {HKV} K/V heads")
    if k_cache.shape[2] != D or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache/v_cache must be [slots, Hkv, D] with q's head_dim")
    return B, Q, HQ, D, HKV


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    page_table: torch.Tensor, prefix_lens: torch.Tensor, new_lens: torch.Tensor,
                    scale: float, page_size: int, mask_mode: str, new_mask: torch.Tensor | None = None,
                    sliding_window: int | None = None, positions: torch.Tensor | None = None,
                    num_splits: int | None = None) -> torch.Tensor:
    """q `[B, Q, Hq, D]`, k/v cache `[slots, Hkv, D]` of one layer → out `[B, Q, Hq, D]` (q's dtype).

    mask_mode: "causal" (new key r visible to query i when r ≤ i), "full" (all new keys) or
    "tree" (`new_mask [B, Q, Q]` bool, lower-triangular as every ancestor mask is, or its
    `pack_tree_mask` words, packed once for all of a forward's layers). With `sliding_window`, `positions [B, Q]` gives the new
    tokens' positions; cached key j sits at position j. Padded queries (i ≥ new_len) give zeros.
    """
    B, Q, HQ, D, HKV = check_paged_args(q, k_cache, v_cache, mask_mode)
    G = HQ // HKV
    g_pad = triton.next_power_of_2(G)
    on_cuda = q.device.type == "cuda"
    block_m, block_n, num_warps, num_stages = _config(Q, g_pad, D, on_cuda, q.element_size())
    block_q = block_m // g_pad
    q_tiles = triton.cdiv(Q, block_q)
    P = page_table.shape[1]
    if num_splits is None:
        num_splits = choose_num_splits(B, HKV, q_tiles, P * page_size, Q, _num_sms(q.device))
    num_splits = max(1, int(num_splits))

    mode = MASK_MODES[mask_mode]
    if mode == 2:
        if new_mask is None:
            raise ValueError("tree mode needs new_mask [B, Q, Q] bool or its pack_tree_mask words")
        mode, mask_arg = _TREE_BITS, new_mask if new_mask.dtype == torch.int32 else pack_tree_mask(new_mask)
        if mask_arg.shape != (B, Q, triton.cdiv(Q, BITS_PER_WORD)):
            raise ValueError(f"new_mask words must be [B, Q, ceil(Q / 32)] = {[B, Q, triton.cdiv(Q, BITS_PER_WORD)]},"
                             f" got {list(mask_arg.shape)}")
        mask_strides = mask_arg.stride()
    else:
        mask_arg, mask_strides = prefix_lens, (0, 0, 0)
    use_window = sliding_window is not None
    if use_window:
        if positions is None:
            raise ValueError("sliding window needs positions [B, Q]")
        pos_arg, pos_strides, window = positions, positions.stride(), int(sliding_window)
    else:
        pos_arg, pos_strides, window = prefix_lens, (0, 0), 0

    out = torch.empty_like(q)
    if num_splits > 1:
        opart = torch.empty((B, Q, HQ, num_splits, D), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, Q, HQ, num_splits), dtype=torch.float32, device=q.device)
    else:
        opart = lse = out
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _paged_attn_kernel[(q_tiles, B * HKV, num_splits)](
        q, k_cache, v_cache, page_table, prefix_lens, new_lens, mask_arg, pos_arg,
        out, opart, lse,
        float(scale) * LOG2E, window, Q, P,
        prefix_lens.stride(0), new_lens.stride(0),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *page_table.stride(),
        *mask_strides, *pos_strides, *out.stride(),
        NUM_KV_HEADS=HKV, G=G, G_PAD=g_pad, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size,
        MASK_MODE=mode, USE_WINDOW=use_window, NUM_SPLITS=num_splits, INPUT_PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _combine_kernel[(B * Q * HQ,)](
            opart, lse, out, Q, *out.stride(),
            HQ=HQ, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
            NUM_SPLITS=num_splits, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
            num_warps=4 if on_cuda else 1,
        )
    return out


def pack_tree_mask(new_mask: torch.Tensor) -> torch.Tensor:
    """`[B, Q, Q]` bool → `[B, Q, ceil(Q / 32)]` int32: bit r % 32 of word r // 32 of query i is
    whether i sees new key r. Plain tensor ops, so a CUDA graph captures it."""
    B, Q, K = new_mask.shape
    words = triton.cdiv(K, BITS_PER_WORD)
    bits = torch.nn.functional.pad(new_mask, (0, words * BITS_PER_WORD - K)).view(B, Q, words, BITS_PER_WORD)
    weights = torch.ones(BITS_PER_WORD, dtype=torch.int64, device=new_mask.device) << torch.arange(
        BITS_PER_WORD, device=new_mask.device)
    packed = (bits.to(torch.int64) * weights).sum(-1)
    # Bit 31 is the sign bit of an int32 word: the same 32 bits, read as two's complement.
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)


def auto_num_splits(q: torch.Tensor, k_cache: torch.Tensor, page_table: torch.Tensor, page_size: int) -> int:
    """The split count `paged_attention` picks when `num_splits` is None (for benchmarks/logging)."""
    B, Q, HQ, D = q.shape
    g_pad = triton.next_power_of_2(HQ // k_cache.shape[1])
    block_m = _config(Q, g_pad, D, q.device.type == "cuda", q.element_size())[0]
    q_tiles = triton.cdiv(Q, block_m // g_pad)
    return choose_num_splits(B, k_cache.shape[1], q_tiles, page_table.shape[1] * page_size, Q, _num_sms(q.device))


__all__ = ["paged_attention", "pack_tree_mask", "choose_num_splits", "auto_num_splits", "MASK_MODES"]
