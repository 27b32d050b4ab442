"""Int4GroupedExperts (blockspec.layers.int4_experts): the W4A16 kernel path (interpreted on CPU,
tests/conftest.py) against GroupedExperts on the dequantised weights, and the reference path."""

from __future__ import annotations

import pytest
import torch

from blockspec.config import MoEConfig
from blockspec.layers.int4_experts import Int4GroupedExperts
from blockspec.layers.moe import GroupedExperts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFG = MoEConfig(num_experts=6, top_k=2, intermediate_size=48)
HIDDEN = 64


def experts_pair(dtype, group_size=32):
    """(Int4GroupedExperts, GroupedExperts holding its dequantised weights), both in `dtype`."""
    dense = GroupedExperts(HIDDEN, CFG)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        dense.gate_up_proj.copy_(torch.randn(dense.gate_up_proj.shape, generator=gen) * 0.1)
        dense.down_proj.copy_(torch.randn(dense.down_proj.shape, generator=gen) * 0.1)
    packed = Int4GroupedExperts.from_experts(dense, CFG, group_size)
    with torch.no_grad():
        gate_up, down = packed.dequantized()
        dense.gate_up_proj.copy_(gate_up)
        dense.down_proj.copy_(down)
    return packed.to(DEVICE, dtype), dense.to(DEVICE, dtype)


def routing(t: int, seed: int):
    """Random top-2 routing over experts 0…3 only (experts 4 and 5 get no tokens)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(t)])
    weights = torch.rand(t, 2, generator=gen)
    return ids.to(DEVICE), weights.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("t", [1, 9])
def test_kernel_matches_grouped_experts_on_dequantised_weights(dtype, t):
    packed, dense = experts_pair(dtype)
    assert packed.gate_up_packed.dtype == torch.int32 and packed.gate_up_packed.shape == (6, 96, 8)
    x = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(t)).to(DEVICE, dtype)
    ids, weights = routing(t, t)
    packed.kernel = True
    with torch.no_grad():
        out, ref = packed(x, ids, weights), dense(x, ids, weights)
    assert out.shape == (t, HIDDEN) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert ((out.float() - ref.float()).abs() <= tol * (1 + ref.float().abs())).all()


def test_reference_path_is_grouped_experts_exactly():
    packed, dense = experts_pair(torch.float32)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ids, weights = routing(5, 2)
    packed.kernel = False
    with torch.no_grad():
        assert torch.equal(packed(x, ids, weights), dense(x, ids, weights))


def test_per_channel_scales_and_wrong_weights_are_caught():
    """Channel strategy (group None: one scale per row) works; a corrupted expert is noticed."""
    packed, dense = experts_pair(torch.float32, group_size=None)
    assert packed.gate_up_scale.shape == (6, 96, 1) and packed.down_scale.shape == (6, 64, 1)
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ids, weights = routing(4, 4)
    packed.kernel = True
    with torch.no_grad():
        ref = dense(x, ids, weights)
        assert torch.allclose(packed(x, ids, weights), ref, atol=1e-5)
        packed.down_scale[ids[0, 0]] *= 2                          # an expert the first token uses
        assert (packed(x, ids, weights) - ref).abs().max() > 1e-2


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_bits"):
        Int4GroupedExperts(HIDDEN, CFG, num_bits=3)
    with pytest.raises(ValueError, match="group_size"):
        Int4GroupedExperts(HIDDEN, CFG, group_size=0)
