"""The order of RMSNorm's sum of squares, as torch computes it, for the fused kernels.

`pow(2).mean(-1)` is a reduction whose fp32 result depends on the order of its additions. The
jit helpers here reproduce torch's own order on the device at hand — its CPU kernel's
(`_sumsq_cpu`), and ATen's CUDA reduction for this many rows (`_sumsq_cuda`, configured by
`cuda_reduce_plan`; `cuda_order_variant` finds the running torch release's details once per
device by comparing candidate orders with torch's result). `layers/triton_ops.py` explains why.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

# torch's CPU sum (aten/src/ATen/native/cpu/SumKernel.cpp), which `_sumsq_cpu` follows, runs
# over rows of Vectorized<float>: 8 lanes (x86-64, AVX2 and the AVX512 build alike), four rows
# at a time (ilp), in a cascade of 4 levels of 16.
# ATen's reduction (aten/src/ATen/native/cuda/Reduce.cuh) for float: 512 threads at most, warps
# of 32, four accumulators (vt0), four-wide input vectors.
_CUDA_MAX_THREADS = 512
_CUDA_WARP = 32
_CUDA_VEC = 4


# ----------------------------------------------------------------------------------------------
# Reduction orders


def _last_pow2(n: int) -> int:
    """ATen's `last_pow2`: the largest power of two not above n (1 at least)."""
    return 1 << (max(n, 1).bit_length() - 1)


# ATen versions differ in details of this reduction: whether a row of exactly 128 floats is
# already "vectorized along input" (`dim0 >= 128` in recent releases, `dim0 > 128` before); the
# warp-shuffle order of `block_x_reduce` (offsets 16, 8, 4, 2, 1 — a halving tree — since a
# 2025 change "for better numerics matching Triton"; 1, 2, 4, 8, 16 — adjacent pairs — before,
# and still on ROCm); and, when a row is split across warps, whether `block_x_reduce` runs
# before `block_y_reduce` ("xy", recent sources) or after ("yx", older ones). A variant is
# `(vec_min, warp_halving, split_order)`, split_order None where no candidate matched (such
# rows then run eagerly); `cuda_order_variant()` finds the running torch's by asking torch.
# Seen on an H200 with torch 2.11: (128, True, ·) on every unsplit shape tried (widths 96 to
# 8192, 1 to 1088 rows), the split order not yet confirmed there.
CUDA_ORDER_VARIANTS = tuple((vec_min, halving, split) for halving in (True, False)
                            for vec_min in (128, 129) for split in ("xy", "yx"))


def cuda_reduce_plan(rows: int, n: int, vec_min: int = 128) -> tuple[int, int, int, int] | None:
    """`(vec, block_x, block_y, passes)` of ATen's `setReduceConfig` for a last-dim float32
    reduction over a fresh contiguous `[rows, n]` tensor (rows start 16-byte aligned), or None
    where its order is not modelled (a vector tail, a split across blocks).

    Thread `t = x + y·block_x` of a row owns elements `t, t + S, t + 2S, …` (`S = block_x ·
    block_y`; in vectors of `vec` when vectorized) and sums them into 4 accumulators (by vector
    lane, or by step modulo 4), combined left to right. The `block_x` lanes are then combined
    by a halving tree in shared memory down to a warp and the warp shuffles, the `block_y`
    threads (block_y > 1 only when ATen splits a row across warps) by a halving tree in shared
    memory, in the order of the variant (see `CUDA_ORDER_VARIANTS`).
    """
    vec = _CUDA_VEC if n >= vec_min else 1    # "vectorize along input"
    if vec > 1 and n % vec:
        return None
    dim0, dim1 = n // vec, rows
    mnt = _CUDA_MAX_THREADS
    d0 = _last_pow2(dim0) if dim0 < mnt else mnt
    d1 = _last_pow2(dim1) if dim1 < mnt else mnt
    bw = min(d0, _CUDA_WARP)
    bh = min(d1, mnt // bw)
    bw = min(d0, mnt // bh)
    step = bw
    vpt = -(-n // step)                 # values_per_thread counts elements, not vectors
    if vpt >= bh * 16 or vpt >= 256:    # split across warps: block_y reduction
        step *= bh
        if -(-n // step) >= 256:        # ATen may then split across blocks: not modelled
            return None
    else:
        bh = 1
    passes = -(-(n // vec) // step)
    return vec, bw, bh, passes


def cuda_order_sum_reference(sq: torch.Tensor, variant: tuple = CUDA_ORDER_VARIANTS[0]) -> torch.Tensor:
    """Σ over the last axis of a float32 `[rows, n]` tensor in ATen's CUDA order (for `variant`),
    stated in plain torch ops (float32 adds round the same on any device). The kernels'
    `_sumsq_cuda` is tested against it; `cuda_order_variant` compares it with torch's own."""
    rows, n = sq.shape
    vec_min, halving, split = variant
    vec, bw, bh, passes = cuda_reduce_plan(rows, n, vec_min)
    s = bw * bh
    acc = torch.zeros(rows, s, 4, dtype=torch.float32, device=sq.device)
    if vec == 4:    # thread t, pass j: vector t + j·s, its lane i into accumulator i
        v = sq.view(rows, n // 4, 4)
        for j in range(passes):
            chunk = v[:, j * s:(j + 1) * s]
            acc[:, :chunk.shape[1]] += chunk
    else:           # thread t, step k: element t + k·s into accumulator k % 4
        for k in range(passes):
            chunk = sq[:, k * s:(k + 1) * s]
            acc[:, :chunk.shape[1], k % 4] += chunk
    t = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    t = t.view(rows, bh, bw)                        # thread x + y·bw

    def block_x(t):     # halving in shared memory down to a warp, then the shuffles
        while t.shape[2] > (1 if halving else 32):
            t = t[:, :, :t.shape[2] // 2] + t[:, :, t.shape[2] // 2:]
        while t.shape[2] > 1:
            t = t[:, :, 0::2] + t[:, :, 1::2]
        return t

    def block_y(t):     # halving in shared memory
        while t.shape[1] > 1:
            t = t[:, :t.shape[1] // 2] + t[:, t.shape[1] // 2:]
        return t

    t = block_y(block_x(t)) if split == "xy" else block_x(block_y(t))
    return t.reshape(rows)


# (rows, n, calls): decode, verify and q/k-norm shapes, widths below/at/above the vector limit;
# then rows split across warps (block_y_reduce), checked separately.
_PROBES = ((1, 4096, 6), (1, 128, 6), (1, 8192, 3), (64, 4096, 1), (256, 128, 1), (64, 96, 1),
           (64, 1000, 1), (16, 2048, 1))
_SPLIT_PROBES = ((2, 8192, 3), (16, 8192, 1), (64, 8192, 1))
_variants: dict = {}          # device → its torch's order variant (cuda_order_variant)


@functools.lru_cache(maxsize=1024)
def _mean_factor(rows: int, n: int) -> float:
    """ATen's `mean_kernel_impl` factor: `float(num_outputs) / numel`, numel converted to float."""
    return float(np.float32(rows) / np.float32(rows * n))


def _matches(probes, variant, device) -> bool:
    for rows, n, sq, mean in probes:
        factor = torch.tensor(_mean_factor(rows, n), dtype=torch.float32, device=device)
        if not torch.equal(cuda_order_sum_reference(sq, variant) * factor, mean):
            return False
    return True


def cuda_order_variant(device: torch.device | str | None = None, mean_of_squares=None) -> tuple | None:
    """The `(vec_min, warp_halving, split_order)` whose order equals torch's own
    `pow(2).mean(-1)` on this device, on random probes where the candidate orders disagree;
    None when no candidate matches the unsplit rows (a torch whose reduction is not modelled:
    RMSNorm then stays eager), split_order None when none matches rows split across warps
    (those rows stay eager). Cached per device; runs torch ops and syncs, so call it outside
    CUDA-graph capture (`enable_fused_ops` does). `mean_of_squares(sq [rows, n]) → [rows]`
    replaces torch's `sq.mean(-1)` as what is matched (tests of the detection; not cached)."""
    device = torch.device(device if device is not None else "cuda")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if mean_of_squares is None and device in _variants:
        return _variants[device]
    mean = mean_of_squares or (lambda sq: sq.mean(-1))
    gen = torch.Generator(device=device).manual_seed(1234)

    def make(spec):
        out = []
        for rows, n, calls in spec:
            for _ in range(calls):
                x = torch.randn(rows, n, generator=gen, device=device) * 3
                sq = x.pow(2)
                out.append((rows, n, sq, mean(sq)))
        return out

    probes, split_probes = make(_PROBES), make(_SPLIT_PROBES)
    found = None
    for vec_min, halving, split in CUDA_ORDER_VARIANTS:
        if split != "xy":
            continue                                   # unsplit rows do not depend on it
        if _matches(probes, (vec_min, halving, split), device):
            found = (vec_min, halving, None)
            for order in ("xy", "yx"):
                if _matches(split_probes, (vec_min, halving, order), device):
                    found = (vec_min, halving, order)
                    break
            break
    if mean_of_squares is None:
        _variants[device] = found
    return found


@triton.jit
def _row_values(x_ptr, r_ptr, x_off, r_off, cols, mask, HAS_RES: tl.constexpr):
    """Columns `cols` of the rows at element offsets x_off (r_off in the residual), as float32:
    x, or (x + residual) rounded to x's dtype first."""
    x = tl.load(x_ptr + x_off + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + r_off + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def _pick(v, lane, i, AXIS: tl.constexpr):
    """Element i along AXIS: a masked sum of one value and zeros, which is exact."""
    return tl.sum(tl.where(lane == i, v, 0.0), axis=AXIS)


@triton.jit
def _sumsq_cpu(x_ptr, r_ptr, x_off, r_off, row_ok, N, HAS_RES: tl.constexpr, ROWS: tl.constexpr):
    """Σ v² of ROWS rows (`x_off`, `r_off`: `[ROWS, 1]` element offsets) in the order of torch's CPU
    `sum` (SumKernel.cpp `vectorized_inner_sum`): `multi_row_sum` over rows of 4 × 8 lanes with
    its 4-level cascade (level step 16), then the leftover 8-lane vectors into ilp row 0, ilp
    rows 1..3 into row 0, and last a scalar running sum of the leftover elements and then of
    the 8 lanes."""
    lane32 = tl.arange(0, 32)[None, :]
    lane8 = tl.arange(0, 8)[None, :]
    ok32 = row_ok & (lane32 < 32)
    nvec = N // 8
    nrow = nvec // 4
    zero = tl.zeros([ROWS, 32], dtype=tl.float32)
    acc0 = zero
    acc1 = zero
    acc2 = zero
    acc3 = zero
    nchunk = nrow // 16
    for c in range(nchunk):
        for j in range(16):
            v = _row_values(x_ptr, r_ptr, x_off, r_off, ((c * 16 + j) * 32 + lane32), ok32, HAS_RES)
            acc0 = acc0 + v * v
        i = (c + 1) * 16
        acc1 = acc1 + acc0
        acc0 = zero
        up2 = (i & 0xF0) == 0
        acc2 = tl.where(up2, acc2 + acc1, acc2)
        acc1 = tl.where(up2, zero, acc1)
        up3 = up2 & ((i & 0xF00) == 0)
        acc3 = tl.where(up3, acc3 + acc2, acc3)
        acc2 = tl.where(up3, zero, acc2)
    for rr in range(nchunk * 16, nrow):
        v = _row_values(x_ptr, r_ptr, x_off, r_off, (rr * 32 + lane32), ok32, HAS_RES)
        acc0 = acc0 + v * v
    acc0 = acc0 + acc1
    acc0 = acc0 + acc2
    acc0 = acc0 + acc3
    # acc0[:, 8k + l] is ilp row k, lane l.
    ilps = tl.reshape(acc0, [ROWS, 4, 8])
    ilp = tl.arange(0, 4)[None, :, None]
    p0 = _pick(ilps, ilp, 0, 1)
    for vv in range(nrow * 4, nvec):
        v = _row_values(x_ptr, r_ptr, x_off, r_off, (vv * 8 + lane8), row_ok & (lane8 < 8), HAS_RES)
        p0 = p0 + v * v
    p0 = p0 + _pick(ilps, ilp, 1, 1)
    p0 = p0 + _pick(ilps, ilp, 2, 1)
    p0 = p0 + _pick(ilps, ilp, 3, 1)
    total = tl.zeros([ROWS], dtype=tl.float32)
    for k in range(nvec * 8, N):
        v = _row_values(x_ptr, r_ptr, x_off, r_off, (k + lane8 * 0), row_ok & (lane8 == 0), HAS_RES)
        total = total + tl.sum(v * v, axis=1)                   # one value and zeros
    for l in tl.static_range(8):
        total = total + _pick(p0, lane8, l, 1)
    return total


@triton.jit
def _block_x(t, ROWS: tl.constexpr, H: tl.constexpr, BW: tl.constexpr, LOG_BW: tl.constexpr,
             WARP_HALVING: tl.constexpr):
    """`[ROWS, H, BW]` → `[ROWS, H, 1]`: halving in shared memory down to a warp, then shfl_down
    by 16, 8, 4, 2, 1 (halving again: WARP_HALVING) or by 1, 2, 4, 8, 16 (adjacent pairs)."""
    for lvl in tl.static_range(LOG_BW):
        if WARP_HALVING or (BW >> lvl) > 32:
            t = tl.sum(tl.reshape(t, [ROWS, H, 2, BW >> (lvl + 1)]), axis=2)
        else:
            t = tl.sum(tl.reshape(t, [ROWS, H, BW >> (lvl + 1), 2]), axis=3)
    return t


@triton.jit
def _block_y(t, ROWS: tl.constexpr, BH: tl.constexpr, W: tl.constexpr, LOG_BH: tl.constexpr):
    """`[ROWS, BH, W]` → `[ROWS, 1, W]`: thread y takes y + BH/2, then y + BH/4, ..."""
    for lvl in tl.static_range(LOG_BH):
        t = tl.sum(tl.reshape(t, [ROWS, 2, BH >> (lvl + 1), W]), axis=1)
    return t


@triton.jit
def _sumsq_cuda(x_ptr, r_ptr, x_off, r_off, row_ok, N, HAS_RES: tl.constexpr, ROWS: tl.constexpr,
                VEC: tl.constexpr, BW: tl.constexpr, BH: tl.constexpr, PASSES: tl.constexpr,
                LOG_BW: tl.constexpr, LOG_BH: tl.constexpr, WARP_HALVING: tl.constexpr,
                SPLIT_XY: tl.constexpr):
    """Σ v² of ROWS rows in the order of ATen's CUDA reduction for the plan `cuda_reduce_plan`
    gave (Reduce.cuh: `input_vectorized_thread_reduce_impl` / `thread_reduce_impl`,
    `block_y_reduce`, `block_x_reduce`)."""
    S: tl.constexpr = BW * BH
    if VEC == 4:
        offs = tl.arange(0, S * 4)[None, :]     # thread offs // 4, vector lane offs % 4
        acc = tl.zeros([ROWS, S * 4], dtype=tl.float32)
        for j in tl.static_range(PASSES):       # unrolled: the loads can all be in flight
            o = j * (S * 4) + offs
            v = _row_values(x_ptr, r_ptr, x_off, r_off, o, row_ok & (o < N), HAS_RES)
            acc = acc + v * v
        lanes = tl.reshape(acc, [ROWS, S, 4])
        lane = tl.arange(0, 4)[None, None, :]
        t = _pick(lanes, lane, 0, 2) + _pick(lanes, lane, 1, 2)
        t = t + _pick(lanes, lane, 2, 2)
        t = t + _pick(lanes, lane, 3, 2)
    else:
        offs = tl.arange(0, S)[None, :]
        a0 = tl.zeros([ROWS, S], dtype=tl.float32)
        a1 = a0
        a2 = a0
        a3 = a0
        for k in tl.static_range(0, PASSES, 4):  # step k of a thread goes to accumulator k % 4
            o = k * S + offs
            v = _row_values(x_ptr, r_ptr, x_off, r_off, o, row_ok & (o < N), HAS_RES)
            a0 = a0 + v * v
            o = o + S
            v = _row_values(x_ptr, r_ptr, x_off, r_off, o, row_ok & (o < N), HAS_RES)
            a1 = a1 + v * v
            o = o + S
            v = _row_values(x_ptr, r_ptr, x_off, r_off, o, row_ok & (o < N), HAS_RES)
            a2 = a2 + v * v
            o = o + S
            v = _row_values(x_ptr, r_ptr, x_off, r_off, o, row_ok & (o < N), HAS_RES)
            a3 = a3 + v * v
        t = ((a0 + a1) + a2) + a3
    # t[:, x + y·BW]: block_x_reduce (over x) and block_y_reduce (over y), in the order SPLIT_XY
    # says (only matters when BH > 1).
    t = tl.reshape(t, [ROWS, BH, BW])
    if SPLIT_XY:
        t = _block_x(t, ROWS, BH, BW, LOG_BW, WARP_HALVING)
        t = _block_y(t, ROWS, BH, 1, LOG_BH)
    else:
        t = _block_y(t, ROWS, BH, BW, LOG_BH)
        t = _block_x(t, ROWS, 1, BW, LOG_BW, WARP_HALVING)
    t = tl.reshape(t, [ROWS, 1])
    return tl.sum(t, axis=1)


@triton.jit
def _sumsq(x_ptr, r_ptr, x_off, r_off, row_ok, N, HAS_RES: tl.constexpr, ROWS: tl.constexpr,
           CPU_ORDER: tl.constexpr, VEC: tl.constexpr, BW: tl.constexpr, BH: tl.constexpr,
           PASSES: tl.constexpr, LOG_BW: tl.constexpr, LOG_BH: tl.constexpr,
           WARP_HALVING: tl.constexpr, SPLIT_XY: tl.constexpr):
    if CPU_ORDER:
        ss = _sumsq_cpu(x_ptr, r_ptr, x_off, r_off, row_ok, N, HAS_RES, ROWS)
    else:
        ss = _sumsq_cuda(x_ptr, r_ptr, x_off, r_off, row_ok, N, HAS_RES, ROWS, VEC, BW, BH, PASSES,
                         LOG_BW, LOG_BH, WARP_HALVING, SPLIT_XY)
    return ss
