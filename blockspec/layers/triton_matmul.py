"""A fixed-tile Triton GEMM for the linear layers of the batch-invariant mode (`--batch-invariant`).

`linear(x, weight, bias)` is `F.linear`: x `[..., K]`, weight `[N, K]`, bias `[N]` or None →
`[..., N]` in x's dtype, accumulated in float32. Every launch uses the same tile (BLOCK_M,
BLOCK_N, BLOCK_K, warps, stages) whatever M is, and each program walks K from 0 in steps of
BLOCK_K, so an output row's reduction order depends on K alone: row r of a product is bit for
bit the same whether x holds 1, 17 or 64 rows, and whichever rows sit beside it. cuBLAS picks
its kernel (and its split of K) from the shape, which is what made a verify of width 17 round
differently from a decode step of width 1 (docs/batch_invariance.md).

On CUDA the tile product is `tl.dot` (tensor cores, the same instruction for every M). Under
Triton's interpreter (`TRITON_INTERPRET=1` before import; CPU tensors, float32/float16 only)
NumPy's matmul may pick its blocking from the shape, so the tile product there is an explicit
multiply-and-sum over the tile's K axis (`USE_DOT=False`), whose order is the same for every
row; `linear(..., use_dot=True)` runs the `tl.dot` path under the interpreter too (tests check
it against torch).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


# M is not specialised (Triton would compile M == 1 and M % 16 == 0 apart): one binary per dtype
# and layout serves every row count.
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                   s_xm, s_xk, s_wn, s_wk, s_om, s_on,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[None, :] * s_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        a = tl.load(x_rows + k[None, :] * s_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_rows + k[:, None] * s_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)   # [BK, BN]
        if USE_DOT:
            acc = tl.dot(a, b.to(a.dtype), acc, input_precision=INPUT_PRECISION)
        else:
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm.to(tl.int64)[:, None] * s_om + rn[None, :] * s_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


INTERPRETED = isinstance(_matmul_kernel, InterpretedFunction)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): one tile for every shape. On CUDA 64×64
# output tiles keep a decode step's weight read spread over N/64 programs; BLOCK_K 64 is the
# reduction's step. Under the interpreter few, large tiles keep the tests fast (each program
# is Python there).
CUDA_TILE = (64, 64, 64, 4, 3)
INTERPRETER_TILE = (32, 128, 64, 1, 1)


def tile() -> tuple[int, int, int, int, int]:
    """The fixed tile of this process (depends only on whether the interpreter runs)."""
    return INTERPRETER_TILE if INTERPRETED else CUDA_TILE


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           use_dot: bool | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with a fixed reduction order: x `[..., K]`, weight `[N, K]`,
    bias `[N]` → `[..., N]` (x's dtype). `use_dot` None: `tl.dot` on CUDA, the explicit
    multiply-sum under the interpreter."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features, weight expects {weight.shape[1]}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}], got {list(bias.shape)}")
    if x.device.type != "cuda" and not INTERPRETED:
        raise ValueError("the batch-invariant GEMM needs CUDA, or TRITON_INTERPRET=1 set before "
                         f"blockspec.layers.triton_matmul is imported (now {os.environ.get('TRITON_INTERPRET')!r})")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    M, K = x2.shape
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out.view(*lead, N)
    bm, bn, bk, warps, stages = tile()
    use_dot = (not INTERPRETED) if use_dot is None else use_dot
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _matmul_kernel[grid](x2, weight, bias if bias is not None else weight, out, M, N, K,
                         *x2.stride(), *weight.stride(), *out.stride(),
                         HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                         USE_DOT=use_dot, INPUT_PRECISION=precision, num_warps=warps, num_stages=stages)
    return out.view(*lead, N)


__all__ = ["linear", "tile", "INTERPRETED", "CUDA_TILE", "INTERPRETER_TILE"]
