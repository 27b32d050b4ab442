"""The deferred context's append kernel (`ring_kernel.append_rows_triton`, interpreter on CPU)
leaves the ring, its positions and slots and the head exactly as the torch reference does:
padding rows anywhere in the batch, a wrap past the ring's end, a cast to the ring's dtype, a
strided feature view; and `DeferredContext.use_kernel` adopts it only when it matches."""

from __future__ import annotations

import logging

import pytest
import torch

import blockspec.speculative.proposers as proposers
from blockspec.speculative.proposers import DeferredContext
from blockspec.speculative.ring_kernel import append_rows, append_rows_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ring_state(capacity, F, dtype, device):
    return (torch.zeros(capacity + 1, F, dtype=dtype, device=device),
            torch.zeros(capacity + 1, 2, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device))


@pytest.mark.parametrize("F, ring_dtype", [(5, torch.float32), (1300, torch.float16)])
def test_appends_equal_the_reference_across_the_rings_end(F, ring_dtype):
    gen = torch.Generator().manual_seed(F)
    want, got = ring_state(7, F, ring_dtype, "cpu"), ring_state(7, F, ring_dtype, DEVICE)
    for step in range(6):                                         # 6 steps of ≤ 4 live rows: wraps twice
        B = 1 + step % 4
        positions = torch.randint(1, 500, (B, 1), generator=gen)
        positions[torch.rand(B, generator=gen) < 0.3] = 0          # padding, mid-batch too
        slots = torch.randint(0, 9000, (B, 1), generator=gen, dtype=torch.int32)
        wide = torch.randn(B, 1, F + 3, generator=gen)
        features = wide[..., 2:F + 2]                              # a strided view
        append_rows(*want, features, positions, slots)
        append_rows_triton(*got, features.to(DEVICE), positions.to(DEVICE), slots.to(DEVICE))
        for w, g in zip(want, got):
            assert torch.equal(g[:-1].cpu() if g.dim() == 2 else g.cpu(), w[:-1] if w.dim() == 2 else w)
    assert int(want[2]) > 7                                        # the head went round the ring


def test_the_context_adopts_the_kernel_only_when_it_matches(monkeypatch, caplog):
    deferred = DeferredContext(lambda *a: None, 6, torch.float32, DEVICE)
    deferred.use_kernel()
    assert deferred.append is append_rows_triton

    def off_by_one(ring, meta, head, features, positions, slots):
        append_rows_triton(ring, meta, head, features, positions, slots)
        head.add_(1)
    monkeypatch.setattr(proposers, "append_rows_triton", off_by_one)
    other = DeferredContext(lambda *a: None, 6, torch.float32, DEVICE)
    with caplog.at_level(logging.WARNING, logger="blockspec.proposers"):
        other.use_kernel()
    assert other.append is append_rows and "append kernel is unusable" in caplog.text
