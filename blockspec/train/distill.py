"""The drafter's loss against the target's distribution (issue 16 part 3: a drafter for sampling).

Cross-entropy against the data's next token teaches the drafter the target's argmax (the
data being the target's own replies). Sampled decoding accepts a draft x ~ q with
probability min(1, p(x)/q(x)), Σ min(p, q) on average, so what counts there is q close to p
as a whole distribution. The loss below mixes the two per trained block position:

    (1 − W) · CE(target token) + W · KL(p ‖ q),   p = softmax(target logits), q = softmax(drafter logits)

weighted by the block's position weights and normalised by their sum. p is the target's
distribution (at T = 1) for the same next token the CE term trains: position k of the block
at anchor a predicts token a + k, and the target's logits for that token are the ones it
computes at position a + k − 1 (the trainer's target forward gives them for free). W = 0 is
exactly the CE loss the trainer always had.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_kl_weight(kl_weight: float) -> float:
    if not 0.0 <= kl_weight <= 1.0:
        raise ValueError(f"kl_weight must be in [0, 1], got {kl_weight}")
    return float(kl_weight)


def kl_from_logits(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per row `[...]`, p = softmax(teacher), q = softmax(student), in float32."""
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher_logits {tuple(teacher_logits.shape)} and student_logits "
                         f"{tuple(student_logits.shape)} differ in shape")
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


def teacher_positions(block_pos: torch.Tensor) -> torch.Tensor:
    """Where the target computes the logits of each block token's next-token target: the
    position before it (block token k of anchor a sits at a + k and predicts token a + k,
    which the target predicts at a + k − 1). Position 0 (an anchor at 0, never trained) is
    clamped to 0."""
    return (block_pos - 1).clamp_min(0)


@torch.no_grad()
def teacher_block_logits(final_hidden: torch.Tensor, block_pos: torch.Tensor, trained: torch.Tensor,
                         lm_head_weight: torch.Tensor) -> torch.Tensor:
    """The target's logits for the trained block tokens `[M, V]`, in the order of
    `x[trained]` (row-major), from its final-normed hidden states `[B, T, H]`."""
    rows, cols = trained.nonzero(as_tuple=True)
    pos = teacher_positions(block_pos)[rows, cols]
    hidden = final_hidden[rows, pos]
    return F.linear(hidden, lm_head_weight.to(hidden.dtype))


def block_distill_loss(student_logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
                       teacher_logits: torch.Tensor | None = None, kl_weight: float = 0.0,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """Σ w·[(1 − W)·CE + W·KL(p‖q)] / Σ w over the rows where `mask` is True (all rows without one).

    student_logits `[..., V]`, targets and weights `[...]`, teacher_logits `[..., V]` (needed when
    W > 0), mask `[...]` bool. Rows outside the mask neither count nor receive gradient,
    whatever their logits hold.
    """
    kl_weight = check_kl_weight(kl_weight)
    if kl_weight > 0 and teacher_logits is None:
        raise ValueError("teacher_logits are needed when kl_weight > 0")
    if mask is not None:
        student_logits, targets, weights = student_logits[mask], targets[mask], weights[mask]
        teacher_logits = teacher_logits[mask] if teacher_logits is not None else None
    ce = F.cross_entropy(student_logits.float().reshape(-1, student_logits.shape[-1]), targets.reshape(-1),
                         reduction="none").reshape(targets.shape)
    per_row = ce
    if kl_weight > 0:
        per_row = (1.0 - kl_weight) * ce + kl_weight * kl_from_logits(teacher_logits, student_logits)
    return (per_row * weights).sum() / weights.sum().clamp_min(1e-6)
