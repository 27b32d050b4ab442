"""A plain step's deferred drafter-context rows appended to the ring by two Triton launches
(`DeferredContext.add`'s torch form is about eleven: a mask, a cumsum, the index arithmetic, two
index copies, a stack, a sum and the head's advance). On the H100 those launches were 14–28 µs of
the speculative engine's 35–45 µs of extra GPU time in a plain step (bench/graph_split.py,
`spec_no_ring`), at every batch: the rows are few, the launches are the cost.

The first launch copies each row (grid: rows × feature blocks) to slot (head + live rows before
it) mod capacity, or to the scratch row `capacity` when it is padding (position 0); the second
advances head by the live rows. Two, because every program of the first must read head before
it moves, and programs of one launch are not ordered.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def append_rows(ring: torch.Tensor, meta: torch.Tensor, head: torch.Tensor, features: torch.Tensor,
                positions: torch.Tensor, slots: torch.Tensor) -> None:
    """The reference (and the CPU's path): `features [B, 1, F]`, `positions`, `slots [B, 1]`
    into `ring [R + 1, F]` and `meta [R + 1, 2]` (position, slot) at `head [1]` (rows ever
    appended), in order; padding rows (position 0) to the scratch row R; head advanced by the
    live rows. Device work only, so a CUDA graph can hold it."""
    capacity = ring.shape[0] - 1
    live = positions[:, 0] > 0
    index = torch.where(live, (head + live.cumsum(0) - 1) % capacity, capacity)
    ring.index_copy_(0, index, features[:, 0].to(ring.dtype))
    meta.index_copy_(0, index, torch.stack([positions[:, 0], slots[:, 0].to(torch.int64)], dim=1))
    head.add_(live.sum())


@triton.jit
def _append_rows_kernel(features_ptr, f_row_stride, positions_ptr, p_stride, slots_ptr, s_stride,
                        ring_ptr, meta_ptr, head_ptr, B, F, capacity,
                        BLOCK_B: tl.constexpr, BLOCK_F: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    rows = tl.arange(0, BLOCK_B)
    before = tl.load(positions_ptr + rows * p_stride, mask=rows < b, other=0)
    position = tl.load(positions_ptr + b * p_stride)
    head = tl.load(head_ptr)
    index = tl.where(position > 0, (head + tl.sum((before > 0).to(tl.int64), axis=0)) % capacity, capacity)
    cols = block * BLOCK_F + tl.arange(0, BLOCK_F)
    inside = cols < F
    row = tl.load(features_ptr + b * f_row_stride + cols, mask=inside)
    tl.store(ring_ptr + index * F + cols, row.to(ring_ptr.dtype.element_ty), mask=inside)
    if block == 0:
        tl.store(meta_ptr + index * 2, position.to(tl.int64))
        tl.store(meta_ptr + index * 2 + 1, tl.load(slots_ptr + b * s_stride).to(tl.int64))


@triton.jit
def _advance_head_kernel(positions_ptr, p_stride, head_ptr, B, BLOCK_B: tl.constexpr):
    rows = tl.arange(0, BLOCK_B)
    positions = tl.load(positions_ptr + rows * p_stride, mask=rows < B, other=0)
    tl.store(head_ptr, tl.load(head_ptr) + tl.sum((positions > 0).to(tl.int64), axis=0))


def append_rows_triton(ring: torch.Tensor, meta: torch.Tensor, head: torch.Tensor, features: torch.Tensor,
                       positions: torch.Tensor, slots: torch.Tensor) -> None:
    """`append_rows` in two launches."""
    B, F = features.shape[0], features.shape[-1]
    if features.stride(-1) != 1:
        features = features.contiguous()
    BLOCK_B = triton.next_power_of_2(max(B, 2))
    BLOCK_F = min(1024, triton.next_power_of_2(F))
    _append_rows_kernel[(B, triton.cdiv(F, BLOCK_F))](
        features, features.stride(0), positions, positions.stride(0), slots, slots.stride(0),
        ring, meta, head, B, F, ring.shape[0] - 1, BLOCK_B=BLOCK_B, BLOCK_F=BLOCK_F)
    _advance_head_kernel[(1,)](positions, positions.stride(0), head, B, BLOCK_B=BLOCK_B)
