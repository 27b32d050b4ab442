"""A sampled tree's children drawn by one Triton program per row (`sampled_tree.sample_children`).

The reference draws every parent's d-th child at once, one round per draw number: about 25
batch-wide ops a round (a sort of the elders' tokens, a searchsorted over every depth's cdf),
and W − 1 rounds, some 400 launches for a 16-node tree. Here a row's nodes are drawn in index
order (elders precede younger siblings, so their tokens are known), each by the reference's
rule: with the elders' tokens s_1 < … < s_R removed, the first token t whose cdf(t) minus the
removed mass below it exceeds u · (total − removed mass), found as the first interval
(before s_1, between s_j and s_{j+1}, after s_R) holding its own searchsorted crossing. The
R + 1 searches of a node run side by side as one vector binary search over the row's cdf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _children_kernel(cdf_ptr, q_ptr, support_ptr, parents_ptr, depths_ptr, u_ptr, u_stride, tokens_ptr,
                     W, L, V, SEARCH_STEPS: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_W)
    inside = offs < W
    parents = tl.load(parents_ptr + b * W + offs, mask=inside, other=-3)
    depths = tl.load(depths_ptr + b * W + offs, mask=inside, other=1)
    tokens = tl.full([BLOCK_W], V, tl.int64)                 # V: not drawn (yet)
    for i in range(1, W):
        parent = tl.sum(tl.where(offs == i, parents, 0), axis=0)
        d = tl.minimum(tl.maximum(tl.sum(tl.where(offs == i, depths, 0), axis=0) - 1, 0), L - 1).to(tl.int64)
        elder = (offs < i) & (parents == parent)
        position = tl.sum(elder.to(tl.int32), axis=0)
        support = tl.load(support_ptr + b * L + d)
        if (parent >= 0) & (position < support):
            cdf = cdf_ptr + (b * L + d) * V
            total = tl.load(cdf + V - 1)
            removed = tl.where(elder, tokens, V)             # the elders' tokens, V for none
            mass = tl.load(q_ptr + (b * L + d) * V + tl.minimum(removed, V - 1), mask=removed < V,
                           other=0.0).to(tl.float64)
            # Removed mass at or below each removed token (for the interval after it), and the
            # next removed token above it (the interval's end).
            below = tl.sum(tl.where(removed[None, :] <= removed[:, None], mass[None, :], 0.0), axis=1)   # [W]
            above = tl.min(tl.where(removed[None, :] > removed[:, None], removed[None, :], V), axis=1)  # [W]
            removed_mass = tl.sum(mass, axis=0)
            u = tl.load(u_ptr + b * u_stride + i - 1).to(tl.float64)
            target = u * (total - removed_mass)
            # One search a lane: lane e (an elder) for the interval starting at its token s_e,
            # lane i (never an elder: elders have smaller indices) for the one before them all.
            before = offs == i
            threshold = tl.where(before, target, target + below)
            end = tl.where(before, tl.min(removed, axis=0), above)
            active = (removed < V) | before
            lo = tl.zeros([BLOCK_W], tl.int64)
            hi = tl.full([BLOCK_W], V, tl.int64)
            for _ in range(SEARCH_STEPS):                   # searchsorted(cdf, threshold, right=True)
                going = active & (lo < hi)
                mid = (lo + hi) // 2
                at_mid = tl.load(cdf + tl.minimum(mid, V - 1), mask=going, other=0.0)
                right = going & (at_mid <= threshold)
                lo = tl.where(right, mid + 1, lo)
                hi = tl.where(going & ~right, mid, hi)
            holds = active & (lo < end)
            token = tl.min(tl.where(holds, lo, V), axis=0)
            refused = (token >= V) | (tl.sum((removed == token).to(tl.int32), axis=0) > 0)
            tokens = tl.where(offs == i, tl.where(refused, V, token), tokens)
    tl.store(tokens_ptr + b * W + offs, tokens, mask=inside)


def sample_children_triton(parents: torch.Tensor, depths: torch.Tensor, draft_probs: torch.Tensor,
                           uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampled_tree.sample_children` (same arguments, same result) by the kernel above."""
    from blockspec.speculative.tree import ROOT_PARENT
    B, W = parents.shape
    L, V = draft_probs.shape[1], draft_probs.shape[2]
    device = parents.device
    tokens = torch.full((B, W), V, dtype=torch.int64, device=device)
    if B and L and W > 1:
        q = draft_probs.float().contiguous()
        cdf = q.double().cumsum(-1)
        support = (q > 0).sum(-1).to(torch.int32)
        u = uniforms.to(torch.float64)
        u = u if u.stride(-1) == 1 else u.contiguous()
        _children_kernel[(B,)](cdf, q, support, parents.to(torch.int64).contiguous(),
                               depths.to(torch.int64).contiguous(), u, u.stride(0), tokens, W, L, V,
                               SEARCH_STEPS=max(V, 2).bit_length(), BLOCK_W=triton.next_power_of_2(W))
    drawn = ((parents >= 0) & (tokens < V)) | (parents == ROOT_PARENT)
    return torch.where(tokens < V, tokens, 0), drawn
