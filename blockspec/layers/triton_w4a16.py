"""W4A16 grouped GEMM in Triton: activations in fp16/bf16 (fp32 too), weights kept packed.

`grouped_matmul(x, packed, scale, offsets)` computes, for every expert e, the rows
`x[offsets[e]:offsets[e+1]]` (tokens sorted by expert) times expert e's weight transposed, the
weight being `(nibble - 8) · scale` as `layers/packed_int.py` defines it. One launch serves all
experts: the host lays out row tiles per expert with tensor ops on the device (no sync, so the
launch can be captured in a CUDA graph) and every program dequantises the weight tile it
needs in registers, so the weights are read from memory packed, at b/16 of their fp16 bytes.
A dense linear layer is the one-expert case.

Memory layout: any strides work, but the weights are read at the memory's rate only when the
packed words and scales are stored N-major (`packed_int.n_major`: the [E, N, W] tensor with N
contiguous), so that a tile's loads across its columns are coalesced; K-major (as checkpoints
ship them) puts a tile's neighbouring columns a row of words apart. Each word is loaded once
and its 32/b fields unpacked one at a time: field j of words w0…w0+KW holds K indices
(w0…w0+KW)·32/b + j, multiplied by the matching (strided) activation columns.

The dequantised tile is rounded to the activation dtype before the product, exactly as
dequantise-then-matmul rounds the dequantised weight; the products accumulate in fp32.
Under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors) it runs in fp32 and fp16
(bfloat16 loads are wrong there in Triton 3.x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr,
                  N, K, E, sxm, swe, swn, sww, sse, ssn, ssg, som,
                  GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_KW: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + pid_m)
    if expert < E:                      # tiles past the last expert's rows do nothing
        PER_WORD: tl.constexpr = 32 // BITS
        # A word's fields share one scale when groups are whole words (group 32, per channel).
        WORD_SCALE: tl.constexpr = GROUP % PER_WORD == 0
        row0 = tl.load(tile_row_ptr + pid_m)
        row_end = tl.load(offsets_ptr + expert + 1)
        rows = row0 + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < row_end
        col_ok = cols < N
        w_base = w_ptr + expert.to(tl.int64) * swe + cols[None, :].to(tl.int64) * swn
        s_base = s_ptr + expert.to(tl.int64) * sse + cols[None, :].to(tl.int64) * ssn
        x_base = x_ptr + rows[:, None].to(tl.int64) * sxm
        num_words = tl.cdiv(K, PER_WORD)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for w0 in range(0, num_words, BLOCK_KW):
            wi = w0 + tl.arange(0, BLOCK_KW)
            wn_ok = (wi < num_words)[:, None] & col_ok[None, :]
            words = tl.load(w_base + wi[:, None].to(tl.int64) * sww, mask=wn_ok, other=0)      # [KW, N]
            if WORD_SCALE:
                scale = tl.load(s_base + ((wi * PER_WORD) // GROUP)[:, None] * ssg, mask=wn_ok,
                                other=0.0).to(tl.float32)
            for j in tl.static_range(PER_WORD):
                ks = wi * PER_WORD + j
                k_ok = ks < K
                a = tl.load(x_base + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [M, KW]
                # `>>` on int32 sign-extends; the mask keeps the field's bits only.
                field = (words >> (j * BITS)) & ((1 << BITS) - 1)
                if not WORD_SCALE:
                    scale = tl.load(s_base + (ks // GROUP)[:, None] * ssg, mask=k_ok[:, None] & col_ok[None, :],
                                    other=0.0).to(tl.float32)
                w = ((field - (1 << (BITS - 1))).to(tl.float32) * scale).to(a.dtype)
                acc += tl.dot(a, w, input_precision=PRECISION)
        out = out_ptr + rows[:, None].to(tl.int64) * som + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@dataclass(frozen=True)
class W4A16Config:
    """One launch's tiling: rows (tokens of one expert), output columns and packed words along K
    per program step, and the compiler's warps and pipeline stages."""

    block_m: int
    block_n: int
    block_kw: int
    num_warps: int = 4
    num_stages: int = 2


def w4a16_config(num_rows: int, on_cuda: bool) -> W4A16Config:
    """The tiling for `num_rows` (token, expert) rows. Few rows an expert (decode, verify: at
    most a few dozen tokens over 384 experts) make each program a matrix-vector product bound by
    the weights' bytes, so the tile is narrow in M. A sweep on an H100 at Kimi's expert shapes
    (`bench/w4a16_tune_gpu.py`, bench/results/gpu_session_g/): 256 columns and 16 words a step
    (3 stages) won at 128 and 512 rows (b = 16, 64) by 10–20 %; at 8 rows (b = 1) tilings were
    within 3 % of each other. Products summed in registers instead of `tl.dot` (1–4 rows a
    tile: a matrix-vector shape) ran 1.5–2.5× slower at every case (gate_up: 0.21 against 0.14 ms
    at 8 rows, 7.0 against 2.8 ms at 512), and fields made float by their bits (2^23 + field)
    instead of an int→float conversion changed nothing measurable (not kept). The best tiling reads the experts hit at ≈ 1.8× their
    bytes' time at 128–512 rows (≈ 3–4× at 8 rows, where too few programs run)."""
    if not on_cuda:
        return W4A16Config(16, 32, 16, 1, 1)
    if num_rows <= 64:
        return W4A16Config(16, 64, 32, 4, 2)
    if num_rows <= 1024:
        return W4A16Config(16, 256, 16, 4, 3)
    return W4A16Config(64, 128, 16, 4, 3)


def row_tiles(offsets: torch.Tensor, num_rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each program's (expert, first row) for experts' row ranges `offsets [E+1]`, on the device.

    The number of tiles is at most min(T, ceil(T / BLOCK_M) + E) whatever the split (an expert
    with rows has at least one a tile), so the grid is fixed by T and E alone; programs past the
    last tile get expert E (nothing to do)."""
    experts = offsets.numel() - 1
    counts = (offsets[1:] - offsets[:-1]).long()
    tiles = (counts + block_m - 1) // block_m
    ends = torch.cumsum(tiles, 0)
    ids = torch.arange(min(num_rows, triton.cdiv(num_rows, block_m) + experts), device=offsets.device)
    expert = torch.searchsorted(ends, ids, right=True)
    owner = expert.clamp(max=experts - 1)
    first_row = offsets.long()[owner] + (ids - (ends - tiles)[owner]) * block_m
    return expert.to(torch.int32), first_row.to(torch.int32)


def grouped_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offsets: torch.Tensor,
                   group_size: int, num_bits: int = 4, config: W4A16Config | None = None) -> torch.Tensor:
    """`x [T, K]` (rows sorted by expert), `packed [E, N, ceil(K·b/32)]` int32, `scale [E, N, ceil(K/G)]`
    for groups of G = `group_size` along K (any strides; N-major reads fastest), `offsets [E+1]`
    (expert e owns rows offsets[e]:offsets[e+1]) → `[T, N]` in x's dtype. `config` overrides
    `w4a16_config`'s tiling (tuning, tests)."""
    t, k = x.shape
    experts, n, words = packed.shape
    if (words != triton.cdiv(k * num_bits, 32) or tuple(scale.shape) != (experts, n, triton.cdiv(k, group_size))
            or offsets.numel() != experts + 1):
        raise ValueError(f"x {tuple(x.shape)}, packed {tuple(packed.shape)}, scale {tuple(scale.shape)} and "
                         f"offsets ({offsets.numel()}) do not describe {experts} experts of {n}×{k}")
    x = x.contiguous()
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    cfg = config or w4a16_config(t, x.is_cuda)
    tile_expert, tile_row = row_tiles(offsets.to(x.device), t, cfg.block_m)
    grid = (tile_expert.numel(), triton.cdiv(n, cfg.block_n))
    _w4a16_kernel[grid](x, packed, scale, out, tile_expert, tile_row, offsets.to(torch.int32),
                        n, k, experts, x.stride(0), *packed.stride(), *scale.stride(), out.stride(0),
                        GROUP=group_size, BITS=num_bits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                        BLOCK_KW=cfg.block_kw, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
