"""Turning the fused pointwise kernels on for a loaded model, only where they are exact.

The kernels (`layers/triton_ops.py`) are written to give eager PyTorch's results bit for bit;
this checks it on the model itself before any request: a short prefill with and without them
must give identical logits. Otherwise (or if a kernel cannot run) the model stays eager and the
log says why, so fusing never changes an output.
"""

from __future__ import annotations

import logging

import torch

from blockspec.attention.metadata import AttentionBatch

log = logging.getLogger("blockspec.engine")

PROBE_TOKENS = 12


@torch.inference_mode()
def probe_logits(model) -> torch.Tensor:
    """Logits of a fixed 12-token prefill in a scratch cache (pages 1…, page 0 reserved)."""
    device = model.lm_head.weight.device
    page_size = 16
    cache = model.cache_spec.allocate(2, page_size, model.lm_head.weight.dtype, device)
    ids = (torch.arange(PROBE_TOKENS, device=device)[None] * 7919) % model.config.vocab_size
    positions = torch.arange(PROBE_TOKENS, device=device)[None]
    batch = AttentionBatch(positions + page_size, torch.ones(1, 1, dtype=torch.long, device=device),
                           torch.zeros(1, dtype=torch.long, device=device),
                           torch.full((1,), PROBE_TOKENS, device=device), None, "causal")
    hidden, _ = model(ids, positions, cache, batch)
    return model.logits(hidden)


def prepare_for_cuda(model, fused_ops: bool = True) -> None:
    """What the engine does to a loaded target on CUDA: q/k/v as one product
    (layers/linear.py) and, unless turned off, the fused kernels that keep the logits exact."""
    model.merge_projections()
    if fused_ops:
        use_fused_ops_if_exact(model)


def use_fused_ops_if_exact(model, ops: tuple[str, ...] | None = None) -> list[str]:
    """Enable each fused op (all, or `ops`) on `model` whose probe logits stay bit-identical;
    log what was kept and what stayed eager, and why. Returns the ops in use."""
    from blockspec.layers.fused import FUSABLE, enable_fused_ops
    eager = probe_logits(model)
    allow_interpreter = model.lm_head.weight.device.type == "cpu"
    kept, refused = [], []
    for op in ops or tuple(FUSABLE):
        try:
            enable_fused_ops(model, (op,), allow_interpreter=allow_interpreter)
            fused = probe_logits(model)
            reason = None if torch.equal(fused, eager) else f"max |Δ logit| {(fused - eager).abs().max().item():.3g}"
        except Exception as e:  # noqa: BLE001 - reported, and the op stays eager
            reason = f"{type(e).__name__}: {str(e)[:120]}"
        if reason is None:
            kept.append(op)
        else:
            enable_fused_ops(model, (op,), enabled=False)
            refused.append(f"{op} ({reason})")
    if kept:
        log.info("fused kernels in use, logits checked equal: %s", ", ".join(kept))
    if refused:
        log.warning("fused kernels left eager: %s", "; ".join(refused))
    return kept
