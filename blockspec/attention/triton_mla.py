"""Triton MLA attention over the paged latent cache: decode, chain/tree verify, prefill.

The absorbed form (docs/models.md): every head attends to the same cached rows
`[latent (R) | rotary key (P)]`; its query is `[q_nope · W_UK (R) | q_rope (P)]`, the score
is their dot product and the output the softmax-weighted latent `[R]` (the caller maps it out
through W_UV). So this is multi-query attention with keys of R + P values and values that are
the keys' first R: the kernel reads each row once per tile for all the tile's heads.

Semantics are those of `ReferenceBackend.mla_forward` (the visibility of `metadata.
visibility_mask`: cached rows < prefix_len, new rows by the causal / full / tree mask; padded
queries give zeros). The new rows must already be in the cache.

Layout: one program handles one (tile of BLOCK_M (query, head) rows and a value split, batch
row, key split); row m of the flattened [Q · H] is query `m // H`, head `m % H`. A value split
computes the tile's scores in full but accumulates only its R / V_SPLITS value columns, which
bounds the accumulator so that a tile can hold all of a query's heads (fewer reads of the cache). Online softmax in float32
(exp2 domain); with several key splits each program writes a normalised partial and its
log-sum-exp, combined by `triton_paged`'s combine kernel. Runs under Triton's interpreter on
CPU tensors (`TRITON_INTERPRET=1`, float32/float16).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from blockspec.attention.triton_paged import (LOG2E, MASK_MODES, _combine_kernel, _num_sms, _visible,
                                              choose_num_splits)


@triton.jit
def _mla_attn_kernel(
    q_ptr, lat_ptr, pt_ptr, prefix_ptr, newlen_ptr, mask_ptr,
    out_ptr, opart_ptr, lse_ptr,
    qk_scale, Q,
    s_pre, s_new,
    s_qb, s_qq, s_qh, s_qd,
    s_ls, s_ld,
    s_ptb, s_ptp,
    s_mb, s_mi, s_mr,
    s_ob, s_oq, s_oh, s_od,
    H: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, MASK_MODE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, INPUT_PRECISION: tl.constexpr, V_SPLITS: tl.constexpr,
):
    tile = tl.program_id(0) // V_SPLITS
    v0 = (tl.program_id(0) % V_SPLITS) * (BLOCK_L // V_SPLITS)
    b64 = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    prefix = tl.load(prefix_ptr + b64 * s_pre).to(tl.int32)
    new_len = tl.load(newlen_ptr + b64 * s_new).to(tl.int32)

    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = m // H
    h = m % H
    row_in = qi < Q
    row_valid = qi < new_len
    dl = tl.arange(0, BLOCK_L)
    dl_ok = dl < LATENT
    dv = v0 + tl.arange(0, BLOCK_L // V_SPLITS)      # this program's value columns
    dv_ok = dv < LATENT
    dr = tl.arange(0, BLOCK_R)
    dr_ok = dr < ROPE
    q_row = b64 * s_qb + qi.to(tl.int64)[:, None] * s_qq + h[:, None] * s_qh
    q_lat = tl.load(q_ptr + q_row + dl[None, :] * s_qd, mask=row_valid[:, None] & dl_ok[None, :], other=0.0)
    q_pe = tl.load(q_ptr + q_row + (LATENT + dr[None, :]) * s_qd, mask=row_valid[:, None] & dr_ok[None, :],
                   other=0.0)

    # Keys this tile can see: [0, hi); a causal tile stops after its last query's own row.
    q_first = (tile * BLOCK_M) // H
    q_last = (tile * BLOCK_M + BLOCK_M - 1) // H
    hi = prefix + new_len
    if MASK_MODE == 0:
        hi = prefix + tl.minimum(q_last + 1, new_len)
    hi = tl.where(q_first >= new_len, 0, hi)     # a tile of padded queries reads nothing
    lo = 0
    if NUM_SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(hi, lo + chunk)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_L // V_SPLITS], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        page = tl.load(pt_ptr + b64 * s_ptb + (n // PAGE_SIZE) * s_ptp, mask=n_ok, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + (n % PAGE_SIZE)
        c = tl.load(lat_ptr + slot[:, None] * s_ls + dl[None, :] * s_ld, mask=n_ok[:, None] & dl_ok[None, :],
                    other=0.0)
        k_pe = tl.load(lat_ptr + slot[:, None] * s_ls + (LATENT + dr[None, :]) * s_ld,
                       mask=n_ok[:, None] & dr_ok[None, :], other=0.0)
        qk = tl.dot(q_lat, tl.trans(c.to(q_lat.dtype)), input_precision=INPUT_PRECISION)
        qk += tl.dot(q_pe, tl.trans(k_pe.to(q_pe.dtype)), input_precision=INPUT_PRECISION)
        qk = qk * qk_scale

        vis, _, _, _ = _visible(n, n_ok, prefix, qi, row_valid, mask_ptr, b64, s_mb, s_mi, s_mr, MASK_MODE)
        qk = tl.where(vis & row_valid[:, None], qk, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if V_SPLITS == 1:
            cv = c
        else:   # the value columns again: the rows were just read, so this load hits the cache
            cv = tl.load(lat_ptr + slot[:, None] * s_ls + dv[None, :] * s_ld, mask=n_ok[:, None] & dv_ok[None, :],
                         other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(cv.dtype), cv, input_precision=INPUT_PRECISION)
        m_i = m_new

    has = (l_i > 0.0) & row_valid
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    o_mask = row_in[:, None] & dv_ok[None, :]
    if NUM_SPLITS == 1:
        o_off = b64 * s_ob + qi.to(tl.int64)[:, None] * s_oq + h[:, None] * s_oh + dv[None, :] * s_od
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # Partials as triton_paged's combine reads them: o [B, Q, H, S, R], lse [B, Q, H, S].
        rowid = (b64 * Q + qi.to(tl.int64)) * H + h
        tl.store(opart_ptr + (rowid * NUM_SPLITS + split)[:, None] * LATENT + dv[None, :], out, mask=o_mask)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        # Every value split computes the same scores, hence the same log-sum-exp: one writes it.
        tl.store(lse_ptr + rowid * NUM_SPLITS + split, lse, mask=row_in & ((qi * 0 + v0) == 0))


@dataclass(frozen=True)
class MLAConfig:
    """One launch's tiling. Each of the ceil(Q·H / block_m) row tiles reads every visible
    latent row once per value split, so wide tiles (all of a query's heads) read the cache
    fewest times; a tile's accumulator is block_m × R / v_splits float32 (registers), which is
    what the value split bounds."""

    block_m: int      # (query, head) rows per program
    block_n: int      # keys per inner step
    v_splits: int     # programs sharing a row tile, each accumulating R / v_splits value columns
    num_warps: int
    num_stages: int

    def programs_per_sm(self, row_dim: int) -> int:
        """1 when the pipeline's key tiles (`num_stages` × block_n rows of `row_dim` bf16 values)
        take over half an SM's shared memory, so programs run in whole waves; else 0 (unknown:
        several share an SM and `choose_num_splits` aims at two waves)."""
        return 1 if self.num_stages * self.block_n * row_dim * 2 > 114 * 1024 else 0


def mla_config(latent_dim: int, on_cuda: bool, query_rows: int = 1, deep_pipeline: bool = True) -> MLAConfig:
    """The launch tiling for `query_rows` = B · Q queries. Sweeps at Kimi's shapes
    (`bench/mla_tune_gpu.py`; bench/results/gpu_session_a/, gpu_session_b/ on an H200,
    gpu_session_i/ on an H100): a tile of all 64 heads without value splits, its accumulator over
    8 warps, reads the cache once per key split and ran 1.7x faster than 16-head tiles at batch
    16, context 32k (0.57 against 0.98 ms); 64-key steps through a 3-deep pipeline then took that
    case from 0.575 to 0.363 ms on the H100 (× 2.88 → × 1.82 the latent read) and won every
    case of 8 or more queries. With few queries (batch 1) 32-head tiles with 64-key steps won
    (0.047 against 0.067 ms), as more programs share the context. Value splits only recomputed
    the scores and lost everywhere. `deep_pipeline`: the device has Hopper's shared memory
    (the 3-deep 64-key pipeline needs about 220 KB a program); else the 32-key, 2-deep tiling.
    Such a program has an SM to itself, so its key splits are counted in whole waves
    (`MLAConfig.programs_per_sm`, `choose_num_splits`): reasoned from the wave arithmetic, not
    yet timed (the sweeps above ran 17 splits at batch 16, three waves of 132 SMs)."""
    if not on_cuda:
        return MLAConfig(16, 16, 1, 1, 1)
    if latent_dim >= 256:
        if query_rows < 8:
            return MLAConfig(32, 64, 1, 8, 2)
        return MLAConfig(64, 64, 1, 8, 3) if deep_pipeline else MLAConfig(64, 32, 1, 8, 2)
    return MLAConfig(32, 64, 1, 4, 2)


@functools.cache
def _has_hopper_smem(device: torch.device) -> bool:
    return torch.cuda.get_device_properties(device).major >= 9


def default_config(q: torch.Tensor, latent_dim: int) -> MLAConfig:
    """`mla_config` for queries `q [B, Q, H, R + P]` on their device."""
    on_cuda = q.device.type == "cuda"
    return mla_config(latent_dim, on_cuda, q.shape[0] * q.shape[1], on_cuda and _has_hopper_smem(q.device))


def default_num_splits(q: torch.Tensor, page_table: torch.Tensor, page_size: int, cfg: MLAConfig) -> int:
    """The key splits `mla_paged_attention` launches `cfg` with unless told (`choose_num_splits`)."""
    B, Q, H, D = q.shape
    return choose_num_splits(B, 1, triton.cdiv(Q * H, cfg.block_m) * cfg.v_splits, page_table.shape[1] * page_size,
                             Q, _num_sms(q.device), programs_per_sm=cfg.programs_per_sm(D))


def mla_paged_attention(q: torch.Tensor, latent_cache: torch.Tensor, page_table: torch.Tensor,
                        prefix_lens: torch.Tensor, new_lens: torch.Tensor, scale: float, page_size: int,
                        latent_dim: int, mask_mode: str, new_mask: torch.Tensor | None = None,
                        num_splits: int | None = None, config: MLAConfig | None = None) -> torch.Tensor:
    """q `[B, Q, H, R + P]`, one layer's latent cache `[slots, R + P]` → out `[B, Q, H, R]` (q's dtype).

    mask_mode: "causal", "full" or "tree" (`new_mask [B, Q, Q]` bool), as `triton_paged`.
    `config` overrides `mla_config`'s tiling (tuning, tests).
    """
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {sorted(MASK_MODES)}, got {mask_mode!r}")
    B, Q, H, D = q.shape
    if latent_cache.shape[-1] != D or not 0 < latent_dim < D:
        raise ValueError(f"q's last dim {D} must equal the cache rows' {latent_cache.shape[-1]} "
                         f"and exceed latent_dim {latent_dim}")
    rope = D - latent_dim
    on_cuda = q.device.type == "cuda"
    cfg = config or default_config(q, latent_dim)
    block_l = max(16, triton.next_power_of_2(latent_dim))
    if block_l % (16 * cfg.v_splits):
        raise ValueError(f"v_splits {cfg.v_splits} must split the latent tile {block_l} into multiples of 16")
    tiles = triton.cdiv(Q * H, cfg.block_m)
    if num_splits is None:
        num_splits = default_num_splits(q, page_table, page_size, cfg)
    num_splits = max(1, int(num_splits))
    mode = MASK_MODES[mask_mode]
    if mode == 2:
        if new_mask is None:
            raise ValueError("tree mode needs new_mask [B, Q, Q]")
        mask_arg = new_mask.view(torch.uint8) if new_mask.dtype == torch.bool else new_mask
        mask_strides = mask_arg.stride()
    else:
        mask_arg, mask_strides = prefix_lens, (0, 0, 0)
    out = q.new_empty(B, Q, H, latent_dim)
    if num_splits > 1:
        opart = torch.empty((B, Q, H, num_splits, latent_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, Q, H, num_splits), dtype=torch.float32, device=q.device)
    else:
        opart = lse = out
    _mla_attn_kernel[(tiles * cfg.v_splits, B, num_splits)](
        q, latent_cache, page_table, prefix_lens, new_lens, mask_arg, out, opart, lse,
        float(scale) * LOG2E, Q, prefix_lens.stride(0), new_lens.stride(0),
        *q.stride(), *latent_cache.stride(), *page_table.stride(), *mask_strides, *out.stride(),
        H=H, LATENT=latent_dim, ROPE=rope, BLOCK_L=block_l, BLOCK_R=max(16, triton.next_power_of_2(rope)),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PAGE_SIZE=page_size, MASK_MODE=mode, NUM_SPLITS=num_splits,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", V_SPLITS=cfg.v_splits,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        _combine_kernel[(B * Q * H,)](
            opart, lse, out, Q, *out.stride(), HQ=H, HEAD_DIM=latent_dim, BLOCK_D=block_l,
            NUM_SPLITS=num_splits, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
            num_warps=4 if on_cuda else 1,
        )
    return out


__all__ = ["MLAConfig", "mla_paged_attention", "mla_config", "default_config", "default_num_splits"]
