"""RMSNorm with a reduction order fixed by the row's length alone (the batch-invariant mode).

Eager `pow(2).mean(-1)` on CUDA is not batch-invariant: ATen picks its reduction's launch
configuration from the number of rows (see triton_reduction.py), so one row's mean can round
differently at batch 1 and batch 17; the fused `triton_ops.rms_norm` reproduces that order on
purpose (bit for bit the eager code). Here a program normalises a fixed number of rows (set
by N alone), loading each whole (`BLOCK = next_power_of_2(N)`) and summing it with one `tl.sum`
along the row, so a row's result is a function of the row alone.

`rms_norm(x, weight, eps, residual=None)`: x (and residual) `[..., N]`, weight `[N]` → the
eager formula `weight * (x·rsqrt(mean(x²) + eps)).to(x.dtype)` of `x` (or of `x + residual`,
the sum rounded to x's dtype, which is returned too). Runs under Triton's interpreter on CPU
(float32/float16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _invariant_rms_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, R, N, s_x, s_r, s_o, s_s, eps,
                          HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    n = tl.arange(0, BLOCK)
    ok = (row < R)[:, None] & (n < N)[None, :]
    x = tl.load(x_ptr + row[:, None] * s_x + n[None, :], mask=ok, other=0.0)
    if HAS_RES:
        x = x.to(tl.float32) + tl.load(r_ptr + row[:, None] * s_r + n[None, :], mask=ok, other=0.0).to(tl.float32)
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row[:, None] * s_s + n[None, :], x, mask=ok)
    xf = x.to(tl.float32)
    mean = tl.sum(xf * xf, axis=1) / N
    normed = (xf * (1.0 / tl.sqrt(mean + eps))[:, None]).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + n, mask=n < N, other=0.0)
    y = w.to(tl.float32)[None, :] * normed.to(tl.float32)
    tl.store(out_ptr + row[:, None] * s_o + n[None, :], y.to(out_ptr.dtype.element_ty), mask=ok)


def rows_per_program(n: int, on_cuda: bool) -> int:
    """Rows one program normalises: a function of the row length alone (so of no batch)."""
    if not on_cuda:
        return 16                      # few programs: each is Python under the interpreter
    return 1 if n >= 1024 else 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[..., N]` → normed `[..., N]`; with `residual` (x's shape) → (normed(x + residual),
    x + residual). The output's dtype is torch's promotion of weight and x, as eagerly."""
    N = x.shape[-1]
    if weight.shape != (N,):
        raise ValueError(f"weight must be [{N}], got {list(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, N), dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    summed = r2 = None
    if residual is not None:
        r2 = residual.reshape(-1, N)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        summed = torch.empty((rows, N), dtype=x.dtype, device=x.device)
    if rows:
        per = rows_per_program(N, x.device.type == "cuda")
        _invariant_rms_kernel[(triton.cdiv(rows, per),)](
            x2, r2 if r2 is not None else x2, weight, out, summed if summed is not None else out, rows, N,
            x2.stride(0), r2.stride(0) if r2 is not None else 0, out.stride(0),
            summed.stride(0) if summed is not None else 0, float(eps),
            HAS_RES=residual is not None, ROWS=per, BLOCK=triton.next_power_of_2(N),
            num_warps=4 if x.device.type == "cuda" and N >= 1024 else 1)
    out = out.view(x.shape)
    return out if residual is None else (out, summed.view(x.shape))


__all__ = ["rms_norm"]
