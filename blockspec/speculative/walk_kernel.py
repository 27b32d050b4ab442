"""Tree verification as one Triton program per row: the greedy walk (`verify.verify_tree_greedy`)
and recursive rejection sampling of a sampled tree (`verify.verify_sampled_tree`).

The reference walks depth by depth in batch-wide tensor ops: about a dozen small kernels a
depth, so a 16-node tree walked to depth 15 (on CUDA the tree's depth bound is the block's:
its real depth is not known on the host without a sync) costs some 180 launches a step, where
a chain's walk (a run of leading matches) costs five. Inside a CUDA graph each launch still
costs a few microseconds of GPU time (a DDTree-16 step of the bundled pair was the slower one:
4,340 against DFlash's 7,290 tok/s at batch 1; with these kernels it still costs 1.26–1.38× a
chain's on an H100, bench/results/gpu_session_l/). Here a row's walk is one loop over its nodes held in registers: same
arithmetic (first matching child in index order, the target's token after each walked
node), so the result equals the reference's exactly (tested). The sampled rule's reference is
worse: N + 1 passes of ~25 ops, several over `[B, V]`; its kernel does the same float32
arithmetic per element (sums in another order, so a test lands on the other side of its
threshold only when u · q is within rounding of r: never in the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from blockspec.speculative.verify import VerifyResult


@triton.jit
def _greedy_walk_kernel(target_ptr, tokens_ptr, parents_ptr, accept_ptr, path_ptr, committed_ptr, W, D,
                        BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inside = offs < W
    target = tl.load(target_ptr + b * W + offs, mask=inside, other=-1)        # the target's token after node i
    tokens = tl.load(tokens_ptr + b * W + offs, mask=inside, other=-1)
    parents = tl.load(parents_ptr + b * W + offs, mask=inside, other=-3)      # (−3: no real parent is)
    row_path = path_ptr + b * (D + 1)
    row_committed = committed_ptr + b * (D + 1)
    current = tl.program_id(0) * 0                                           # int32 scalars carried by the loop
    walking = current + 1
    accepted_count = current
    tl.store(row_path, 0)
    for depth in range(0, D):
        sampled = tl.sum(tl.where(offs == current, target, 0), axis=0)
        tl.store(row_committed + depth, tl.where(walking > 0, sampled, -1))
        match = inside & (parents == current) & (tokens == sampled)
        first = tl.min(tl.where(match, offs, BLOCK), axis=0)
        ok = (walking > 0) & (first < W)
        tl.store(row_path + depth + 1, tl.where(ok, first, -1).to(tl.int64))
        accepted_count += ok.to(tl.int32)
        current = tl.where(ok, first, current)
        walking = ok.to(tl.int32)
    sampled = tl.sum(tl.where(offs == current, target, 0), axis=0)
    tl.store(row_committed + D, tl.where(walking > 0, sampled, -1))
    tl.store(accept_ptr + b, accepted_count.to(tl.int64))


def verify_tree_greedy_triton(target_tokens: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                              max_depth: int, is_chain: bool = False) -> VerifyResult:
    """`verify_tree_greedy` by the kernel above: target_tokens, node_tokens, parents `[B, N+1]`
    (int64); result widths `max_depth + 1`. `is_chain` is accepted for the same signature: one
    program walks a chain as cheaply as a tree."""
    B, W = node_tokens.shape
    device = node_tokens.device
    accept_len = torch.empty(B, dtype=torch.int64, device=device)
    path = torch.empty(B, max_depth + 1, dtype=torch.int64, device=device)
    committed = torch.empty(B, max_depth + 1, dtype=torch.int64, device=device)
    if B:
        _greedy_walk_kernel[(B,)](target_tokens.to(torch.int64).contiguous(), node_tokens.to(torch.int64).contiguous(),
                                  parents.to(torch.int64).contiguous(), accept_len, path, committed, W, max_depth,
                                  BLOCK=triton.next_power_of_2(max(W, 2)))
    return VerifyResult(accept_len=accept_len, path=path, committed=committed)


@triton.jit
def _sampled_tree_kernel(p_ptr, q_ptr, tokens_ptr, parents_ptr, u_ptr, u_stride, bonus_ptr, r_ptr, rq_ptr,
                         accept_ptr, path_ptr, committed_ptr, W, L, V, D, HAS_Q,
                         BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """One row of `verify_sampled_tree`: r (the residual) and rq (q with the tested siblings
    removed) live in this row's scratch `[V]` rows; each test reads two of their entries, a
    rejection rewrites r in two passes, an acceptance reloads both from the child's p and q."""
    b = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, BLOCK_W)
    inside = offs_w < W
    tokens = tl.load(tokens_ptr + b * W + offs_w, mask=inside, other=0)
    parents = tl.load(parents_ptr + b * W + offs_w, mask=inside, other=-3)
    uniforms = tl.load(u_ptr + b * u_stride + offs_w - 1, mask=inside & (offs_w > 0), other=0.0).to(tl.float64)
    offs_d = tl.arange(0, BLOCK_D)
    row_path = path_ptr + b * (D + 1)
    row_committed = committed_ptr + b * (D + 1)
    tl.store(row_path + offs_d, tl.where(offs_d == 0, 0, -1).to(tl.int64), mask=offs_d <= D)
    tl.store(row_committed + offs_d, tl.full([BLOCK_D], -1, tl.int64), mask=offs_d <= D)
    r = r_ptr + b * V
    rq = rq_ptr + b * V
    p_row = p_ptr + b * W * V
    q_row = q_ptr + b * L * V
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        m = o < V
        tl.store(r + o, tl.load(p_row + o, mask=m, other=0.0), mask=m)
        tl.store(rq + o, tl.load(q_row + o, mask=o < V * HAS_Q, other=0.0), mask=m)
    current = tl.program_id(0) * 0                    # int32 scalars carried by the loop
    depth = current
    walking = current + 1
    tested = tl.zeros([BLOCK_W], tl.int32)
    for _ in range(0, W):
        if walking > 0:
            child = tl.min(tl.where(inside & (parents == current) & (tested == 0), offs_w, BLOCK_W), axis=0)
            if child < W:
                token = tl.sum(tl.where(offs_w == child, tokens, 0), axis=0)
                u = tl.sum(tl.where(offs_w == child, uniforms, 0.0), axis=0)
                mass = tl.zeros([BLOCK_V], tl.float32)
                for v0 in range(0, V, BLOCK_V):
                    o = v0 + tl.arange(0, BLOCK_V)
                    mass += tl.load(rq + o, mask=o < V, other=0.0)
                mass_sum = tl.maximum(tl.sum(mass, axis=0), 1.1754943508222875e-38)   # (float32's tiny)
                q_token = tl.load(rq + token) / mass_sum
                if u * q_token.to(tl.float64) < tl.load(r + token).to(tl.float64):
                    tl.store(row_committed + depth, token.to(tl.int64))
                    tl.store(row_path + depth + 1, child.to(tl.int64))
                    next_q = q_row + tl.minimum(depth + 1, L - 1) * V
                    for v0 in range(0, V, BLOCK_V):
                        o = v0 + tl.arange(0, BLOCK_V)
                        m = o < V
                        tl.store(r + o, tl.load(p_row + child * V + o, mask=m, other=0.0), mask=m)
                        tl.store(rq + o, tl.load(next_q + o, mask=m, other=0.0), mask=m)
                    depth += 1
                    current = child
                else:
                    # r ← norm((r − q_i)⁺), or r kept where that is all zero (`rejection_residual`).
                    total = tl.zeros([BLOCK_V], tl.float32)
                    for v0 in range(0, V, BLOCK_V):
                        o = v0 + tl.arange(0, BLOCK_V)
                        m = o < V
                        left = tl.load(r + o, mask=m, other=0.0) - tl.load(rq + o, mask=m, other=0.0) / mass_sum
                        total += tl.maximum(left, 0.0)
                    total_sum = tl.sum(total, axis=0)
                    if total_sum > 0:
                        for v0 in range(0, V, BLOCK_V):
                            o = v0 + tl.arange(0, BLOCK_V)
                            m = o < V
                            left = tl.load(r + o, mask=m, other=0.0) - tl.load(rq + o, mask=m, other=0.0) / mass_sum
                            tl.store(r + o, tl.maximum(left, 0.0) / total_sum, mask=m)
                    tl.store(rq + token, 0.0)
                    tested = tl.where(offs_w == child, 1, tested)
            else:
                walking = current * 0
    # The bonus: an inverse-CDF draw from the residual the row stopped with (`sample_from_probs`).
    total64 = tl.zeros([BLOCK_V], tl.float64)
    last_positive = tl.zeros([BLOCK_V], tl.int32)
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(r + o, mask=o < V, other=0.0)
        total64 += x.to(tl.float64)
        last_positive = tl.maximum(last_positive, tl.where(x > 0, o, 0))
    threshold = tl.load(bonus_ptr + b).to(tl.float64) * tl.sum(total64, axis=0)
    carry = tl.sum(total64, axis=0) * 0.0
    at_or_below = tl.zeros([BLOCK_V], tl.int32)
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(r + o, mask=o < V, other=0.0).to(tl.float64)
        cdf = carry + tl.cumsum(x, axis=0)
        at_or_below += ((cdf <= threshold) & (o < V)).to(tl.int32)
        carry += tl.sum(x, axis=0)
    bonus = tl.minimum(tl.sum(at_or_below, axis=0), tl.max(last_positive, axis=0))
    tl.store(row_committed + depth, bonus.to(tl.int64))
    tl.store(accept_ptr + b, depth.to(tl.int64))


def verify_sampled_tree_triton(target_probs: torch.Tensor, draft_probs: torch.Tensor, node_tokens: torch.Tensor,
                               parents: torch.Tensor, accept_uniforms: torch.Tensor, bonus_uniforms: torch.Tensor,
                               max_depth: int) -> VerifyResult:
    """`verify.verify_sampled_tree` (same arguments, same result) by the kernel above: one
    program a row instead of N + 1 batch-wide passes of ~25 ops each over `[B, V]`."""
    B, W, V = target_probs.shape
    L = draft_probs.shape[1]
    device = target_probs.device
    accept_len = torch.empty(B, dtype=torch.int64, device=device)
    path = torch.empty(B, max_depth + 1, dtype=torch.int64, device=device)
    committed = torch.empty(B, max_depth + 1, dtype=torch.int64, device=device)
    if B:
        uniforms = accept_uniforms.to(torch.float64)
        uniforms = uniforms if uniforms.stride(-1) == 1 else uniforms.contiguous()
        scratch = torch.empty(2, B, V, dtype=torch.float32, device=device)
        _sampled_tree_kernel[(B,)](target_probs.float().contiguous(), draft_probs.float().contiguous(),
                                   node_tokens.to(torch.int64).contiguous(), parents.to(torch.int64).contiguous(),
                                   uniforms, uniforms.stride(0), bonus_uniforms.to(torch.float64).contiguous(), scratch[0], scratch[1],
                                   accept_len, path, committed, W, L, V, max_depth, int(L > 0),
                                   BLOCK_W=triton.next_power_of_2(max(W, 2)),
                                   BLOCK_D=triton.next_power_of_2(max_depth + 1),
                                   BLOCK_V=min(2048, triton.next_power_of_2(V)))
    return VerifyResult(accept_len=accept_len, path=path, committed=committed)
