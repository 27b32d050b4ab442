"""The W4A16 grouped GEMM (blockspec.layers.triton_w4a16) against dequantise-then-matmul.

Without CUDA it runs under Triton's interpreter (tests/conftest.py sets it), in float32 and
float16; on CUDA compiled, in bfloat16 too. The reference rounds the dequantised weight to the
activation dtype, as the kernel does, so the two differ only in the order of fp32 additions.
"""

from __future__ import annotations

import pytest
import torch

from blockspec.layers.int4_linear import Int4Linear
from blockspec.layers.packed_int import dequantize_packed, n_major, pack_int32, quantize_symmetric
from blockspec.layers.triton_w4a16 import W4A16Config, grouped_matmul, row_tiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def experts(e: int, n: int, k: int, group: int, seed: int = 0):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(seed)) * 0.1
    values, scale = quantize_symmetric(w, group)
    return pack_int32(values, 4), scale


def reference(x, packed, scale, offsets, group):
    """Dequantise each expert to x's dtype, multiply its rows in float32, round to x's dtype."""
    k = x.shape[1]
    out = []
    for e in range(packed.shape[0]):
        w = dequantize_packed(packed[e], scale[e], k, group).to(x.dtype).float()
        out.append(x[offsets[e]:offsets[e + 1]].float() @ w.T)
    return torch.cat(out).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout, config", [("k_major", W4A16Config(16, 32, 16, 1, 1)),
                                            ("n_major", W4A16Config(16, 32, 16, 1, 1))])
@pytest.mark.parametrize("counts, n, k, group", [([5, 0, 20, 1], 40, 96, 32),    # an empty expert, N < a tile
                                                 ([3], 130, 64, 32),               # one expert: a dense layer
                                                 ([17, 70], 64, 160, 32),          # > one row tile, > one K step
                                                 ([2, 9], 48, 300, 12),            # groups within a word, K % 8
                                                 ([4, 1], 24, 100, 100)])          # one group a row (per channel)
def test_grouped_matmul_matches_dequantised_reference(dtype, layout, config, counts, n, k, group):
    packed, scale = experts(len(counts), n, k, group)
    scale = scale.to(dtype)
    offsets = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
    x = torch.randn(sum(counts), k, generator=torch.Generator().manual_seed(1)).to(dtype)
    dev = lambda t: n_major(t.to(DEVICE)) if layout == "n_major" else t.to(DEVICE)   # noqa: E731
    # Small tiles: several K steps, row and column tiles.
    out = grouped_matmul(dev(x), dev(packed), dev(scale), offsets.to(DEVICE), group, config=config).cpu()
    ref = reference(x, packed, scale, offsets, group)
    assert out.dtype == dtype and out.shape == (sum(counts), n)
    ulp = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert ((out.float() - ref.float()).abs() <= ulp * (1 + ref.float().abs())).all()


def test_wrong_nibble_offset_is_caught():
    """Negative control: weights read without the offset of 8 are far from the kernel's output."""
    packed, scale = experts(1, 32, 64, 32)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    offsets = torch.tensor([0, 4], dtype=torch.int32)
    out = grouped_matmul(x.to(DEVICE), packed.to(DEVICE), scale.to(DEVICE), offsets.to(DEVICE), 32).cpu()
    unsigned = dequantize_packed(packed[0], scale[0], 64, 32) + 8 * scale[0].repeat_interleave(32, -1)
    assert (out - x @ unsigned.T).abs().max() > 0.1
    assert torch.allclose(out, reference(x, packed, scale, offsets, 32), atol=1e-5)


@pytest.mark.parametrize("offsets", [[0, 5, 5, 40, 41],            # ceil(41/16) + E = 7 programs
                                     [0, 1, 1, 2, 2, 2, 3, 3, 3]])  # fewer rows than experts: T = 3 programs
def test_row_tiles_cover_every_row_once(offsets):
    offsets = torch.tensor(offsets)
    rows, num_experts = offsets[-1].item(), offsets.numel() - 1
    expert, first = row_tiles(offsets, rows, 16)
    assert expert.numel() == min(rows, -(-rows // 16) + num_experts)
    seen = []
    for e, r in zip(expert.tolist(), first.tolist()):
        if e < num_experts:
            seen += [(e, row) for row in range(r, min(r + 16, offsets[e + 1].item()))]
    assert sorted(seen) == [(e, row) for e in range(num_experts) for row in range(offsets[e], offsets[e + 1])]


def test_shape_mismatch_is_refused():
    packed, scale = experts(2, 32, 64, 32)
    with pytest.raises(ValueError, match="do not describe 2 experts"):
        grouped_matmul(torch.zeros(3, 64), packed, scale, torch.tensor([0, 3], dtype=torch.int32), 32)


@pytest.mark.parametrize("dtype", DTYPES[:2], ids=str)
def test_int4_linear_kernel_and_reference_agree(dtype):
    linear = torch.nn.Linear(96, 48, bias=True)
    layer = Int4Linear.from_linear(linear).to(DEVICE, dtype)
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    layer.kernel = False
    ref = layer(x)
    assert torch.equal(ref, torch.nn.functional.linear(x, layer.dequantized().to(dtype), layer.bias))
    layer.kernel = True
    out = layer(x)
    assert out.shape == (2, 5, 48)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert ((out.float() - ref.float()).abs() <= tol * (1 + ref.float().abs())).all()
    # Quantisation itself stays within half a step of the float weight.
    err = (layer.dequantized() - linear.weight.detach().to(DEVICE)).abs()
    assert (err <= layer.weight_scale.float().repeat_interleave(32, -1) / 2 + 1e-3).all()
