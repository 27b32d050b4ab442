"""New K and V into the paged cache in one Triton launch (instead of an index copy for each).

Row t of the flattened new tokens goes to cache slot `slots[t]`; k and v may be strided views
(the K and V thirds of a merged q/k/v product) as long as each token's heads × head_dim block
has a unit last stride. A plain copy, so it equals `KVCache.write` bit for bit. Runs under
Triton's interpreter too (`TRITON_INTERPRET=1`, CPU tensors, float32/float16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr, Q, s_kb, s_kq, s_kh, s_vb, s_vq, s_vh,
                     s_cs, s_ch, H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b, i = t // Q, t % Q
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D)
    dst = slot * s_cs + h * s_ch + d
    k = tl.load(k_ptr + b * s_kb + i * s_kq + h * s_kh + d, mask=mask)
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + b * s_vb + i * s_vq + h * s_vh + d, mask=mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> bool:
    """Store k, v `[B, Q, H, D]` at `slots [B, Q]` of one layer's cache `[num_slots, H, D]`.
    Returns False (nothing written) for layouts the kernel does not take, so the caller's
    index copy runs instead."""
    B, Q, H, D = k.shape
    if (v.shape != k.shape or slots.shape != (B, Q) or k.stride(-1) != 1 or v.stride(-1) != 1
            or k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride() or k_cache.shape[1:] != (H, D)):
        return False
    if k.numel() == 0:
        return True
    flat = slots.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    _kv_write_kernel[(B * Q,)](k, v, flat, k_cache, v_cache, Q, k.stride(0), k.stride(1), k.stride(2),
                               v.stride(0), v.stride(1), v.stride(2), k_cache.stride(0), k_cache.stride(1),
                               H=H, D=D, BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
                               num_warps=1 if H * D <= 1024 else 4)
    return True


def store_new_kv(cache, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The new k, v `[B, Q, H, D]` into `cache` (a `KVCache`) at `slots [B, Q]` of `layer`: one
    Triton launch where the layout allows (`write_kv`), else the cache's index copy."""
    if not write_kv(cache.k[layer], cache.v[layer], slots, k, v):
        cache.write(layer, slots, k, v)
