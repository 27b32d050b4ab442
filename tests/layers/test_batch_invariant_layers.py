"""The batch-invariant layers: the fixed-tile GEMM equals torch and gives a row the same bits
at M = 1, 17 and 64 (and beside other rows); the fixed-order RMSNorm likewise; the switch turns
a model's layers over and refuses what it does not cover. Without CUDA under the interpreter."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from blockspec.layers import triton_invariant_norm, triton_matmul
from blockspec.layers.batch_invariant import InvariantLinear, is_batch_invariant, make_batch_invariant
from blockspec.layers.norm import RMSNorm, rms_norm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
assert DEVICE == "cuda" or triton_matmul.INTERPRETED, \
    f"no CUDA and triton_matmul is not interpreted (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r})"
DTYPES = (torch.float32, torch.float16)


def rand(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_dot", [None, True])
def test_gemm_equals_torch(dtype, use_dot):
    x, w, b = rand(3, 23, 72, dtype=dtype, seed=0), rand(40, 72, dtype=dtype, seed=1), rand(40, dtype=dtype, seed=2)
    got = triton_matmul.linear(x, w, b, use_dot=use_dot)
    want = nn.functional.linear(x.float(), w.float(), b.float())
    assert got.shape == (3, 23, 40) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(triton_matmul.linear(x, w).float(), nn.functional.linear(x.float(), w.float()),
                               atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_row_bits_do_not_depend_on_m(dtype):
    """Row r of x at M = 1, 17, 64, at other offsets in the tile and beside other rows."""
    x, w = rand(64, 72, dtype=dtype, seed=3), rand(40, 72, dtype=dtype, seed=4)
    full = triton_matmul.linear(x, w)
    others = rand(64, 72, dtype=dtype, seed=5)
    for r in (0, 5, 16, 40):
        alone = triton_matmul.linear(x[r:r + 1], w)[0]
        assert torch.equal(alone, full[r])
        seventeen = torch.cat([others[:7], x[r:r + 1], others[7:16]])      # r at offset 7 of 17
        assert torch.equal(triton_matmul.linear(seventeen, w)[7], full[r])


def test_a_shape_dependent_tile_would_be_caught(monkeypatch):
    """The check above can fail: picking BLOCK_K from M (as cuBLAS picks its kernel) changes a
    row's bits between M = 1 and M = 64."""
    x, w = rand(64, 200, dtype=torch.float32, seed=3), rand(40, 200, dtype=torch.float32, seed=4)
    full = triton_matmul.linear(x, w)
    bm, bn, bk, warps, stages = triton_matmul.tile()
    monkeypatch.setattr(triton_matmul, "tile", lambda: (bm, bn, bk // 4, warps, stages))
    assert not torch.equal(triton_matmul.linear(x[:1], w)[0], full[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_equals_eager_and_is_row_invariant(dtype):
    x, w = rand(17, 96, dtype=dtype, seed=6), 1 + 0.1 * rand(96, dtype=dtype, seed=7)
    res = rand(17, 96, dtype=dtype, seed=8)
    got = triton_invariant_norm.rms_norm(x, w, 1e-6)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), rms_norm_reference(x, w, 1e-6).float(), atol=tol, rtol=tol)
    normed, summed = triton_invariant_norm.rms_norm(x, w, 1e-6, res)
    assert torch.equal(summed, x + res)
    torch.testing.assert_close(normed.float(), rms_norm_reference(x + res, w, 1e-6).float(), atol=tol, rtol=tol)
    for r in (0, 9):
        assert torch.equal(triton_invariant_norm.rms_norm(x[r:r + 1], w, 1e-6)[0], got[r])
    # a strided view of rows (q heads of a merged projection) reads the same values
    wide = torch.cat([x, x], dim=-1)[:, :96]
    assert torch.equal(triton_invariant_norm.rms_norm(wide, w, 1e-6), got)


def tiny_model(dtype=torch.float32):
    model = nn.Sequential(nn.Linear(8, 16), RMSNorm(16, 1e-6), nn.Linear(16, 4, bias=False))
    return model.to(dtype).to(DEVICE)


def test_switch_turns_layers_over_and_back():
    model = tiny_model()
    x = rand(5, 8, dtype=torch.float32, seed=9)
    eager = model(x)
    assert make_batch_invariant(model, allow_interpreter=True) == 3
    assert is_batch_invariant(model) and type(model[0]) is InvariantLinear and model[1].batch_invariant
    torch.testing.assert_close(model(x), eager, atol=1e-5, rtol=1e-5)
    assert torch.equal(model(x[2:3])[0], model(x)[2])
    make_batch_invariant(model, enabled=False)
    assert not is_batch_invariant(model) and type(model[0]) is nn.Linear


def test_switch_refuses_what_it_does_not_cover():
    from blockspec.layers.int4_linear import Int4Linear
    model = nn.Sequential(Int4Linear.from_linear(nn.Linear(32, 16)), nn.Linear(16, 4))
    with pytest.raises(ValueError, match="batch_invariant does not cover int4"):
        make_batch_invariant(model, allow_interpreter=True)
    assert type(model[1]) is nn.Linear                     # refused before anything changed
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="batch_invariant needs a CUDA device"):
            make_batch_invariant(tiny_model())            # CPU without allow_interpreter
        if triton_matmul.INTERPRETED:
            with pytest.raises(ValueError, match="batch_invariant under Triton's interpreter needs float32"):
                make_batch_invariant(tiny_model(torch.bfloat16), allow_interpreter=True)
