"""Fused Triton kernels for the decode step's pointwise work: RMSNorm, residual add + RMSNorm,
rotary embedding, SwiGLU's `silu(gate) * up`. One launch each, bit for bit the eager layers.

Exactness means reproducing every rounding point of the eager code, not only its formula:

* Elementwise ops round where torch rounds. A bf16/fp16 op computes in fp32 and rounds to the
  dtype (a product of two 8- or 11-bit significands is exact in fp32, so that is one rounding;
  a sum may round twice, fp32 then dtype, exactly as torch does). `a*b + c*d` is three roundings
  in the dtype, never an FMA: every launch passes `enable_fp_fusion=False`, and divisions are
  `div_rn` (Triton's `/` is an approximate division).
* RMSNorm's `pow(2).mean(-1)` is a reduction, whose result depends on the order of its fp32
  additions. The kernels reproduce the order of the reduction that torch itself runs on the
  tensor's device (`_sumsq_cuda`, `_sumsq_cpu` in triton_reduction.py say which), each addition as an explicit
  elementwise add or a sum over an axis of two, so neither Triton's nor NumPy's own reduction
  order enters. CUDA's order depends on the number of rows (ATen picks its launch
  configuration from the output count) and, in details, on the torch release:
  `cuda_reduce_plan` reproduces the configuration, `cuda_order_variant` finds the release's
  details by comparing candidate orders with torch's own result once per device, and where
  nothing is modelled or matched the eager path runs instead (so do views
  whose rows are not in row-major order, e.g. transposed ones: torch's `pow(2)` keeps their
  layout and its reduction runs in another order; row-major views with gaps between rows, like
  the q/k halves of a merged projection, are read in place).
* rsqrt is libdevice's (the `rsqrtf` torch's CUDA kernel calls) on CUDA, and 1/sqrt, as torch's
  CPU kernel computes it, under the interpreter; silu's exp is libdevice's `expf` on CUDA.

Under Triton's interpreter (`TRITON_INTERPRET=1` in the environment before this module is
imported, CPU tensors, float32/float16 only: bfloat16 loads read garbage there in Triton 3.x)
RMSNorm, the residual add and RoPE equal torch's CPU kernels bit for bit; silu does not quite,
since NumPy's `exp` is not torch's (Sleef) `exp`. On CUDA all four equal torch's CUDA kernels
bit for bit in every dtype (`bench/triton_ops_gpu.py` checks; seen on an H200, torch 2.11:
RoPE, silu·mul and the residual add at every shape tried; RMSNorm's reduction order matching
at every unsplit shape tried, and the rest of RMSNorm exact wherever the order matched).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

try:  # dispatches to the CUDA or HIP library when a kernel is compiled
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - very old triton
    libdevice = None

from blockspec.layers.triton_reduction import (CUDA_ORDER_VARIANTS, _last_pow2, _mean_factor, _row_values,
                                                _sumsq, _variants, cuda_order_variant, cuda_reduce_plan)


# ----------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, R, R2, N, sx1, sx2, sr1, sr2, scale, eps,
                     HAS_RES: tl.constexpr, CPU_ORDER: tl.constexpr, LIBDEVICE: tl.constexpr,
                     ROWS: tl.constexpr, VEC: tl.constexpr, BW: tl.constexpr, BH: tl.constexpr,
                     PASSES: tl.constexpr, LOG_BW: tl.constexpr, LOG_BH: tl.constexpr,
                     WARP_HALVING: tl.constexpr, SPLIT_XY: tl.constexpr, CHUNK: tl.constexpr):
    """Rows r = (r // R2, r % R2) of x (strides sx1, sx2; the last axis contiguous) and of the
    residual (sr1, sr2); outputs contiguous."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < R)[:, None]
    r64 = rows.to(tl.int64)
    x_off = ((r64 // R2) * sx1 + (r64 % R2) * sx2)[:, None]
    r_off = ((r64 // R2) * sr1 + (r64 % R2) * sr2)[:, None]
    o_off = r64[:, None] * N
    ss = _sumsq(x_ptr, res_ptr, x_off, r_off, row_ok, N, HAS_RES, ROWS, CPU_ORDER, VEC, BW, BH,
                PASSES, LOG_BW, LOG_BH, WARP_HALVING, SPLIT_XY)
    if CPU_ORDER:   # torch CPU: sum, then divide by N
        mean = tl.div_rn(ss, scale)
    else:           # torch CUDA: MeanOps, the sum times the float factor 1/N
        mean = ss * scale
    var = mean + eps
    if LIBDEVICE:
        inv = libdevice.rsqrt(var)
    else:
        inv = tl.math.rsqrt(var)
    inv = inv[:, None]
    for start in range(0, N, CHUNK):
        cols = start + tl.arange(0, CHUNK)[None, :]
        mask = row_ok & (cols < N)
        v = _row_values(x_ptr, res_ptr, x_off, r_off, cols, mask, HAS_RES)
        if HAS_RES:
            tl.store(sum_ptr + o_off + cols, v.to(sum_ptr.dtype.element_ty), mask=mask)
        y = (v * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + o_off + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sumsq_kernel(x_ptr, out_ptr, R, N, CPU_ORDER: tl.constexpr, ROWS: tl.constexpr,
                  VEC: tl.constexpr, BW: tl.constexpr, BH: tl.constexpr, PASSES: tl.constexpr,
                  LOG_BW: tl.constexpr, LOG_BH: tl.constexpr, WARP_HALVING: tl.constexpr,
                  SPLIT_XY: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    off = rows.to(tl.int64)[:, None] * N
    ss = _sumsq(x_ptr, x_ptr, off, off, (rows < R)[:, None], N, False, ROWS, CPU_ORDER, VEC, BW, BH,
                PASSES, LOG_BW, LOG_BH, WARP_HALVING, SPLIT_XY)
    tl.store(out_ptr + rows, ss, mask=rows < R)


@triton.jit
def _rope_one(x_ptr, o_ptr, c_row, s_row, b, t, H, half, sxb, sxt, sxh, sob, sot, soh,
              BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    dmask = d < half
    mask = (h < H) & dmask
    c1 = tl.load(c_row + d, mask=dmask, other=0.0).to(tl.float32)
    c2 = tl.load(c_row + half + d, mask=dmask, other=0.0).to(tl.float32)
    s1 = tl.load(s_row + d, mask=dmask, other=0.0).to(tl.float32)
    s2 = tl.load(s_row + half + d, mask=dmask, other=0.0).to(tl.float32)
    xp = x_ptr + b * sxb + t * sxt + h * sxh + d
    x1 = tl.load(xp, mask=mask, other=0.0)
    x2 = tl.load(xp + half, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1]: each product and the sum rounded.
    o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
    op = o_ptr + b * sob + t * sot + h * soh + d
    tl.store(op, o1, mask=mask)
    tl.store(op + half, o2, mask=mask)


@triton.jit
def _rope_kernel(q_ptr, qo_ptr, k_ptr, ko_ptr, cos_ptr, sin_ptr, T, HQ, HK, half,
                 sqb, sqt, sqh, sqob, sqot, sqoh, skb, skt, skh, skob, skot, skoh,
                 scb, sct, ssb, sst,
                 HAS_K: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    c_row = cos_ptr + b * scb + t * sct
    s_row = sin_ptr + b * ssb + t * sst
    _rope_one(q_ptr, qo_ptr, c_row, s_row, b, t, HQ, half, sqb, sqt, sqh, sqob, sqot, sqoh,
              BLOCK_HQ, BLOCK_D)
    if HAS_K:
        _rope_one(k_ptr, ko_ptr, c_row, s_row, b, t, HK, half, skb, skt, skh, skob, skot, skoh,
                  BLOCK_HK, BLOCK_D)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, n, sg, su, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    """Row `program_id(0)` (gate/up row strides sg, su; output contiguous), a block of columns."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(g_ptr + row * sg + cols, mask=mask, other=0.0)
    u = tl.load(u_ptr + row * su + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gf)
    else:
        e = tl.exp(-gf)
    act = tl.div_rn(gf, 1.0 + e).to(g.dtype)                 # silu(gate), in gate's dtype
    out = act.to(tl.float32) * u.to(tl.float32)
    tl.store(o_ptr + row * n + cols, out.to(o_ptr.dtype.element_ty), mask=mask)


# Whether the kernels above were defined under TRITON_INTERPRET=1 (CPU tensors) or compiled (CUDA).
INTERPRETED = isinstance(_rms_norm_kernel, InterpretedFunction)


# ----------------------------------------------------------------------------------------------
# Wrappers


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        if INTERPRETED:
            raise RuntimeError("blockspec.layers.triton_ops was imported under TRITON_INTERPRET=1: "
                               "its kernels take CPU tensors only")
    elif not INTERPRETED:
        raise RuntimeError(f"Triton kernels need CUDA tensors (got {t.device}); on the CPU set "
                           "TRITON_INTERPRET=1 before importing blockspec.layers.triton_ops")


def _launch_opts(t: torch.Tensor) -> dict:
    return {} if t.device.type == "cpu" else {"enable_fp_fusion": False}


@functools.lru_cache(maxsize=1024)
def _sumsq_config(rows: int, n: int, order: str, variant: tuple | None = None):
    """(rows a program, the reduction's constexprs, num_warps) for `order` ("cpu": torch's CPU
    order, "cuda": ATen's CUDA order for this many rows, in `variant`), or None where not
    modelled."""
    if order == "cpu":
        block_rows = min(triton.next_power_of_2(rows), 32)     # the interpreter: amortise its ops
        return block_rows, dict(CPU_ORDER=True, ROWS=block_rows, VEC=1, BW=1, BH=1, PASSES=1,
                                LOG_BW=0, LOG_BH=0, WARP_HALVING=True, SPLIT_XY=True), 4
    if variant is None:
        return None
    vec_min, halving, split = variant
    plan = cuda_reduce_plan(rows, n, vec_min)
    if plan is None:
        return None
    vec, bw, bh, passes = plan
    if bh > 1 and split is None:
        return None
    per_row = bw * bh * vec                                      # elements a row loads per pass
    # Several rows a program only once there are enough programs to fill the GPU (~128 SMs).
    block_rows = _last_pow2(max(1, min(1024 // per_row, rows // 128)))
    num_warps = 8 if block_rows * per_row >= 2048 else 4
    return block_rows, dict(CPU_ORDER=False, ROWS=block_rows, VEC=vec, BW=bw, BH=bh, PASSES=passes,
                            LOG_BW=bw.bit_length() - 1, LOG_BH=bh.bit_length() - 1,
                            WARP_HALVING=halving, SPLIT_XY=split != "yx"), num_warps


def _rms_norm_eager(x, weight, eps):
    from blockspec.layers.norm import rms_norm_reference
    return rms_norm_reference(x, weight, eps)


def _row_layouts(tensors, n: int):
    """`(R2, [(s1, s2) per tensor])`: the leading axes of same-shape tensors as rows
    `(r // R2, r % R2)` at element offset `(r // R2)·s1 + (r % R2)·s2`, last axis contiguous,
    rows in row-major order without overlap (then torch's `pow(2)` of such a view comes out
    contiguous, so its reduction runs as for a contiguous tensor); None if there is no such
    split (permuted views, say), for which the eager code runs."""
    lead = tensors[0].shape[:-1]
    if any(t.stride(-1) != 1 and n > 1 for t in tensors):
        return None
    for k in range(len(lead) + 1):
        r1, r2 = math.prod(lead[:k]), math.prod(lead[k:])
        try:
            views = [t.view(r1, r2, n) for t in tensors]
        except RuntimeError:
            continue
        strides = [(v.stride(0), v.stride(1)) for v in views]
        if all((r2 == 1 or s2 >= n) and (r1 == 1 or s1 >= max(r2 * s2, n)) for s1, s2 in strides):
            return r2, strides
    return None


_plans: dict = {}        # (shapes, strides, dtypes, device) → _rms_norm_plan's answer


def _rms_norm_plan(x, residual, weight):
    """The launch of the fused RMSNorm for these tensors: a dict, "empty" for no rows, or None
    when the eager path must run (see the module doc). Memoised by layout: the plan is pure
    Python over shapes and strides, and planning every call cost an eager prefill more host
    time than the kernels (about 0.15 ms a norm on an H200's host, bench/prefill_profile.py)."""
    key = (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype,
           None if residual is None else (residual.shape, residual.stride(), residual.dtype))
    if key in _plans:
        return _plans[key]
    plan = _plan_rms_norm(x, residual, weight)
    if plan is not None or x.device.type == "cpu" or x.device in _variants:
        _plans[key] = plan           # (not while the CUDA order is uncalibrated: that answer may change)
    return plan


def _plan_rms_norm(x, residual, weight):
    n = x.shape[-1] if x.dim() else 0
    if (x.dim() == 0 or weight.dim() != 1 or weight.shape[0] != n or not weight.is_contiguous()
            or x.dtype not in (torch.float32, torch.float16, torch.bfloat16)):
        return None
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        return None
    rows = x.numel() // n if n else 0
    if rows == 0 or n == 0:
        return "empty"
    layout = _row_layouts([x] if residual is None else [x, residual], n)
    if layout is None:
        return None
    r2, strides = layout
    cpu = x.device.type == "cpu"
    if cpu:
        cfg = _sumsq_config(rows, n, "cpu")
    else:
        if x.device not in _variants and torch.cuda.is_current_stream_capturing():
            return None                     # not calibrated: no syncs inside a graph capture
        cfg = _sumsq_config(rows, n, "cuda", cuda_order_variant(x.device))
    if cfg is None:
        return None
    block_rows, consts, num_warps = cfg
    return dict(rows=rows, n=n, r2=r2, strides=strides, cfg=cfg, cpu=cpu,
                # torch CPU divides the sum by n; CUDA's MeanOps multiplies it by
                # float(rows) / float(numel).
                scale=float(n) if cpu else _mean_factor(rows, n),
                chunk=min(triton.next_power_of_2(n), max(16, (8192 if cpu else 4096) // block_rows)))


def rms_norm_is_fused(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
    """Whether `rms_norm` / `add_rms_norm` on these tensors run the kernel (True) or the eager
    code (False: an unmodelled reduction order or layout; exact either way)."""
    return _rms_norm_plan(x, residual, weight) is not None


def _rms_norm_launch(x, residual, weight, eps):
    """(normed, summed or None), or None when the eager path must run."""
    plan = _rms_norm_plan(x, residual, weight)
    if plan is None:
        return None
    _check_device(x)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    summed = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    if plan == "empty":
        return out, summed
    block_rows, consts, num_warps = plan["cfg"]
    (sx1, sx2), (sr1, sr2) = plan["strides"][0], plan["strides"][-1]
    _rms_norm_kernel[(triton.cdiv(plan["rows"], block_rows),)](
        x, residual if residual is not None else x, weight, out, summed if summed is not None else out,
        plan["rows"], plan["r2"], plan["n"], sx1, sx2, sr1, sr2, plan["scale"], float(eps),
        HAS_RES=residual is not None, LIBDEVICE=not plan["cpu"], CHUNK=plan["chunk"],
        num_warps=num_warps, **consts, **_launch_opts(x))
    return out, summed


def row_sum_of_squares(x: torch.Tensor, order: str | None = None,
                       variant: tuple = CUDA_ORDER_VARIANTS[0]) -> torch.Tensor:
    """Σ x² over the last axis in float32, in torch's CPU ("cpu") or CUDA ("cuda", in `variant`)
    summation order (default: that of x's device): the reduction inside `rms_norm`, exposed
    for tests. For "cuda", the plan is that of a `[rows, n]` reduction; raises ValueError where
    `cuda_reduce_plan` has none."""
    order = order or x.device.type
    _check_device(x)
    x = x.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    out = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    cfg = _sumsq_config(rows, n, order, variant)
    if cfg is None:
        raise ValueError(f"ATen's reduction order over ({rows}, {n}) is not modelled")
    block_rows, consts, num_warps = cfg
    if rows:
        _sumsq_kernel[(triton.cdiv(rows, block_rows),)](x, out, rows, n, num_warps=num_warps,
                                                          **consts, **_launch_opts(x))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm` (blockspec.layers.norm) in one launch: normalise in float32, cast to x's dtype,
    times the weight (in the promoted dtype). Falls back to the eager code where the reduction
    order is not reproduced (non-contiguous x, unmodelled CUDA launch configurations)."""
    res = _rms_norm_launch(x, None, weight, eps)
    return _rms_norm_eager(x, weight, eps) if res is None else res[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual), x + residual)` in one launch, the sum rounded to x's dtype as
    torch rounds it (x and residual of one shape and dtype, else the eager code runs)."""
    res = _rms_norm_launch(x, residual, weight, eps)
    if res is None:
        summed = x + residual
        return _rms_norm_eager(summed, weight, eps), summed
    return res


def _rope_view(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`apply_rope(q, cos, sin), apply_rope(k, cos, sin)` in one launch: q `[B, T, Hq, D]`, k
    `[B, T, Hk, D]` (or None), cos/sin `[B, T, D]` (broadcastable), all of one dtype."""
    from blockspec.layers.rope import apply_rope as eager
    tensors = [q, cos, sin] + ([k] if k is not None else [])
    if (q.dim() != 4 or q.shape[-1] % 2 or any(t.dtype != q.dtype for t in tensors)
            or (k is not None and (k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]))
            or cos.shape != sin.shape or cos.dim() != 3):
        return eager(q, cos, sin), (eager(k, cos, sin) if k is not None else None)
    B, T, HQ, D = q.shape
    try:
        cos_b, sin_b = cos.expand(B, T, D), sin.expand(B, T, D)
    except RuntimeError:
        return eager(q, cos, sin), (eager(k, cos, sin) if k is not None else None)
    _check_device(q)
    q = _rope_view(q)
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k is not None:
        k = _rope_view(k)
        ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        kk, HK = k, k.shape[2]
    else:
        ko, kk, HK = qo, q, 1
    if cos_b.stride(-1) != 1:
        cos_b = cos_b.contiguous()
    if sin_b.stride(-1) != 1:
        sin_b = sin_b.contiguous()
    if q.numel() == 0:
        return qo, (ko if k is not None else None)
    half = D // 2
    _rope_kernel[(B * T,)](
        q, qo, kk, ko, cos_b, sin_b, T, HQ, HK, half,
        q.stride(0), q.stride(1), q.stride(2), qo.stride(0), qo.stride(1), qo.stride(2),
        kk.stride(0), kk.stride(1), kk.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos_b.stride(0), cos_b.stride(1), sin_b.stride(0), sin_b.stride(1),
        HAS_K=k is not None, BLOCK_HQ=triton.next_power_of_2(HQ), BLOCK_HK=triton.next_power_of_2(HK),
        BLOCK_D=triton.next_power_of_2(half), num_warps=4, **_launch_opts(q))
    return qo, (ko if k is not None else None)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`blockspec.layers.rope.apply_rope` in one launch: x `[B, T, H, D]`, cos/sin `[B, T, D]`."""
    return apply_rope_qk(x, None, cos, sin)[0]


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` in one launch: silu in float32 rounded to gate's dtype, then the
    product rounded to the promoted dtype. gate and up of one shape, rows of each at one stride
    (contiguous, or the halves of a merged gate/up product); else the eager code runs."""
    eager = lambda: torch.nn.functional.silu(gate) * up  # noqa: E731
    if gate.shape != up.shape or gate.dim() == 0:
        return eager()
    n = gate.shape[-1]
    try:
        g2, u2 = gate.view(-1, n), up.view(-1, n)
    except RuntimeError:
        return eager()
    if n > 1 and (g2.stride(1) != 1 or u2.stride(1) != 1):
        return eager()
    _check_device(gate)
    out = torch.empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    rows = g2.shape[0]
    if out.numel() == 0:
        return out
    block = 1024 if n >= 1024 else triton.next_power_of_2(n)
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](
        g2, u2, out, n, g2.stride(0), u2.stride(0), LIBDEVICE=gate.device.type != "cpu",
        BLOCK=block, num_warps=4, **_launch_opts(gate))
    return out
