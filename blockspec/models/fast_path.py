"""The CUDA fast path of a loaded model: merged projections, and the fused pointwise kernels
turned on only where they are exact.

The kernels (`layers/triton_ops.py`) are written to give eager PyTorch's results bit for bit;
this checks it on the model itself before any request: a short probe (a prefill for a target,
a block for a DFlash drafter) with and without them must give identical outputs. Otherwise (or
if a kernel cannot run) the model stays eager and the log says why, so fusing never changes an
output. Used by the engine (targets) and the DFlash proposer (its drafter).
"""

from __future__ import annotations

import logging

import torch

from blockspec.attention.metadata import AttentionBatch
from blockspec.layers.linear import merge_submodule_projections

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


@torch.inference_mode()
def probe_drafter(drafter) -> torch.Tensor:
    """A DFlash drafter's hidden states for a fixed 4-token block after 12 context tokens of
    fixed features, in a scratch cache: what `use_fused_ops_if_exact` compares for a drafter."""
    weight = drafter.fc.weight
    cfg, page_size = drafter.config, 16
    cache = cfg.cache_spec.allocate(2, page_size, weight.dtype, weight.device)
    ctx_pos = torch.arange(PROBE_TOKENS, device=weight.device)[None]
    features = torch.linspace(-2, 2, PROBE_TOKENS * weight.shape[1], device=weight.device)
    drafter.write_context(features.view(1, PROBE_TOKENS, -1).sin(), ctx_pos, ctx_pos + page_size, cache)
    block = 4
    positions = PROBE_TOKENS + torch.arange(block, device=weight.device)[None]
    embeds = torch.linspace(-1, 1, block * cfg.hidden_size, device=weight.device).view(1, block, -1).cos()
    batch = AttentionBatch(positions + page_size, torch.ones(1, 1, dtype=torch.long, device=weight.device),
                           torch.full((1,), PROBE_TOKENS, device=weight.device),
                           torch.full((1,), block, device=weight.device), None, "full")
    return drafter(embeds.to(weight.dtype), positions, cache, batch)


def prepare_for_cuda(model, fused_ops: bool = True) -> None:
    """What the engine does to a loaded target on CUDA: q/k/v (and gate/up) as one product
    (layers/linear.py) and, unless turned off, the fused kernels that keep the logits exact."""
    model.merge_projections()
    if fused_ops:
        use_fused_ops_if_exact(model)
    else:
        # One eager forward before any graph capture: layers that settle their path on first
        # use (the MoE experts' grouped product, layers/moe.py) do it here.
        probe_logits(model)


def prepare_drafter_for_cuda(drafter, fused_ops: bool) -> None:
    """The same for a DFlash drafter: merged projections, and the fused kernels that keep its
    probe hidden states (`probe_drafter`) exact."""
    merge_submodule_projections(drafter)
    if fused_ops:
        use_fused_ops_if_exact(drafter, probe=probe_drafter, what="drafter")


def use_fused_ops_if_exact(model, ops: tuple[str, ...] | None = None, probe=probe_logits,
                           what: str = "target") -> list[str]:
    """Enable each fused op (all, or `ops`) on `model` whose `probe(model)` output stays
    bit-identical; log what was kept and what stayed eager, and why. Returns the ops in use."""
    from blockspec.layers.fused import FUSABLE, enable_fused_ops
    eager = probe(model)
    allow_interpreter = eager.device.type == "cpu"
    kept, refused = [], []
    for op in ops or tuple(FUSABLE):
        try:
            enable_fused_ops(model, (op,), allow_interpreter=allow_interpreter)
            fused = probe(model)
            reason = None if torch.equal(fused, eager) else f"max |Δ logit| {(fused - eager).abs().max().item():.3g}"
        except Exception as e:  # noqa: BLE001 - reported, and the op stays eager
            reason = f"{type(e).__name__}: {str(e)[:120]}"
        if reason is None:
            kept.append(op)
        else:
            enable_fused_ops(model, (op,), enabled=False)
            refused.append(f"{op} ({reason})")
    if kept:
        log.info("%s: fused kernels in use, outputs checked equal: %s", what, ", ".join(kept))
    if refused:
        log.warning("%s: fused kernels left eager: %s", what, "; ".join(refused))
    return kept
