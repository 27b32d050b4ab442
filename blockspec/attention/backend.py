"""The attention-backend interface: what a model layer calls instead of a kernel.

A forward plans once (`plan`: the step's batch → whatever the backend precomputes, e.g. the
reference's dense visibility mask) and then calls `forward` in every layer. Writing the new
tokens' K/V into the paged cache is part of `forward`, so a backend may fuse it. Backends hold
no per-step state, so one instance serves the target and the drafter, eager and graphed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from blockspec.attention.metadata import AttentionBatch
from blockspec.kv.cache import KVCache, LatentCache


@dataclass
class AttentionPlan:
    """One forward's planned attention: the batch, one layer variant's window, and
    backend-specific precomputation (`extra`, which also carries the variant's causality)."""

    batch: AttentionBatch
    sliding_window: int | None = None
    positions: torch.Tensor | None = None
    extra: object = None


class AttentionBackend:
    """plan(batch, cache, ...) once per forward and per mask variant; forward(...) per layer."""

    name = "abstract"

    def plan(self, batch: AttentionBatch, cache: KVCache, sliding_window: int | None = None,
             causal: bool = False, positions: torch.Tensor | None = None) -> AttentionPlan:
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                plan: AttentionPlan, scale: float) -> torch.Tensor:
        """q `[B, Q, Hq, D]`, new k/v `[B, Q, Hkv, D]` → out `[B, Q, Hq, D]`; writes k/v to the cache."""
        raise NotImplementedError

    def mla_forward(self, q: torch.Tensor, latent: torch.Tensor, cache: LatentCache, layer: int,
                    plan: AttentionPlan, scale: float) -> torch.Tensor:
        """MLA in its absorbed form over a `LatentCache` (docs/models.md): q `[B, Q, H, R + P]`
        (each head's query mapped into the latent space, then its rotary part), new latent
        rows `[B, Q, R + P]` → out `[B, Q, H, R]`, softmax(q · row) over the visible rows times
        their first R values. Writes the new rows to the cache."""
        raise NotImplementedError


def select_backend(name: str, device: torch.device, batch_invariant: bool = False) -> AttentionBackend:
    """"auto" is Triton on CUDA and the reference elsewhere; asking for Triton without CUDA (or
    without triton installed) is refused, never silently replaced. `batch_invariant`: the
    fixed-order Triton kernel (attention/invariant_backend.py), on CUDA or under the
    interpreter; with the reference backend it is refused."""
    from blockspec.attention.reference import ReferenceBackend
    if batch_invariant:
        if name not in ("auto", "triton"):
            raise ValueError(f"batch_invariant needs attention_backend 'triton' or 'auto', got {name!r} "
                             "(the reference's SDPA is not batch-invariant)")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"batch_invariant needs a CUDA device (got {device}); the CPU runs its kernels "
                             "only under Triton's interpreter (TRITON_INTERPRET=1, tests)")
        try:
            from blockspec.attention.invariant_backend import BatchInvariantBackend
        except ImportError as e:
            raise ValueError(f"batch_invariant attention is unavailable: {e}") from None
        return BatchInvariantBackend()
    if name == "auto":
        name = "triton" if device.type == "cuda" else "reference"
    if name == "reference":
        return ReferenceBackend()
    if name == "triton":
        # On the CPU only under Triton's interpreter (the kernel tests run the engine that way).
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend 'triton' needs a CUDA device (the CPU uses 'reference')")
        try:
            from blockspec.attention.triton_backend import TritonBackend
        except ImportError as e:
            raise ValueError(f"attention_backend 'triton' is unavailable: {e}") from None
        return TritonBackend()
    raise ValueError(f"unknown attention backend {name!r}")
