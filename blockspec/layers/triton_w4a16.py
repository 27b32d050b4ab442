"""W4A16 grouped GEMM in Triton: activations in fp16/bf16 (fp32 too), weights kept packed.

`grouped_matmul(x, packed, scale, offsets)` computes, for every expert e, the rows
`x[offsets[e]:offsets[e+1]]` (tokens sorted by expert) times expert e's weight transposed, the
weight being `(nibble - 8) · scale` as `layers/packed_int.py` defines it. One launch serves all
experts: the host lays out row tiles per expert with tensor ops on the device (no sync, so the
launch can be captured in a CUDA graph) and every program dequantises the weight tile it
needs in registers, so the weights are read from memory packed, at b/16 of their fp16 bytes.
A dense linear layer is the one-expert case.

The dequantised tile is rounded to the activation dtype before the product, exactly as
dequantise-then-matmul rounds the dequantised weight; the products accumulate in fp32.
Under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors) it runs in fp32 and fp16
(bfloat16 loads are wrong there in Triton 3.x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr,
                  N, K, E, sxm, swe, swn, sse, ssn, som,
                  GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + pid_m)
    if expert < E:                      # tiles past the last expert's rows do nothing
        PER_WORD: tl.constexpr = 32 // BITS
        row0 = tl.load(tile_row_ptr + pid_m)
        row_end = tl.load(offsets_ptr + expert + 1)
        rows = row0 + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < row_end
        col_ok = cols < N
        w_base = w_ptr + expert.to(tl.int64) * swe + cols[None, :].to(tl.int64) * swn
        s_base = s_ptr + expert.to(tl.int64) * sse + cols[None, :].to(tl.int64) * ssn
        x_base = x_ptr + rows[:, None].to(tl.int64) * sxm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(x_base + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wk_ok = k_ok[:, None] & col_ok[None, :]
            words = tl.load(w_base + (ks // PER_WORD)[:, None], mask=wk_ok, other=0)
            # `>>` on int32 sign-extends; the mask keeps the field's bits only.
            field = (words >> ((ks % PER_WORD) * BITS)[:, None]) & ((1 << BITS) - 1)
            scale = tl.load(s_base + (ks // GROUP)[:, None], mask=wk_ok, other=0.0)
            w = ((field - (1 << (BITS - 1))).to(tl.float32) * scale.to(tl.float32)).to(a.dtype)
            acc += tl.dot(a, w, input_precision=PRECISION)
        out = out_ptr + rows[:, None].to(tl.int64) * som + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def row_tiles(offsets: torch.Tensor, num_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each program's (expert, first row) for experts' row ranges `offsets [E+1]`, on the device.

    The number of tiles is at most ceil(T / BLOCK_M) + E whatever the split, so the grid is
    fixed by T and E alone; programs past the last tile get expert E (nothing to do)."""
    experts = offsets.numel() - 1
    counts = (offsets[1:] - offsets[:-1]).long()
    tiles = (counts + block_m - 1) // block_m
    ends = torch.cumsum(tiles, 0)
    ids = torch.arange(triton.cdiv(num_rows, block_m) + experts, device=offsets.device)
    expert = torch.searchsorted(ends, ids, right=True)
    owner = expert.clamp(max=experts - 1)
    first_row = offsets.long()[owner] + (ids - (ends - tiles)[owner]) * block_m
    return expert.to(torch.int32), first_row.to(torch.int32)


def grouped_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offsets: torch.Tensor,
                   group_size: int, num_bits: int = 4) -> torch.Tensor:
    """`x [T, K]` (rows sorted by expert), `packed [E, N, ceil(K·b/32)]` int32, `scale [E, N, ceil(K/G)]`
    for groups of G = `group_size` along K, `offsets [E+1]` (expert e owns rows
    offsets[e]:offsets[e+1]) → `[T, N]` in x's dtype."""
    t, k = x.shape
    experts, n, words = packed.shape
    if (words != triton.cdiv(k * num_bits, 32) or tuple(scale.shape) != (experts, n, triton.cdiv(k, group_size))
            or offsets.numel() != experts + 1):
        raise ValueError(f"x {tuple(x.shape)}, packed {tuple(packed.shape)}, scale {tuple(scale.shape)} and "
                         f"offsets ({offsets.numel()}) do not describe {experts} experts of {n}×{k}")
    x, packed, scale = x.contiguous(), packed.contiguous(), scale.contiguous()
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block_m, block_n, block_k = (16 if t <= 64 else 64), 64, 64
    tile_expert, tile_row = row_tiles(offsets.to(x.device), t, block_m)
    grid = (tile_expert.numel(), triton.cdiv(n, block_n))
    _w4a16_kernel[grid](x, packed, scale, out, tile_expert, tile_row, offsets.to(torch.int32),
                        n, k, experts, x.stride(0), packed.stride(0), packed.stride(1),
                        scale.stride(0), scale.stride(1), out.stride(0),
                        GROUP=group_size, BITS=num_bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
    return out
