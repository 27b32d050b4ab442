"""The drafter's mixed loss (1 − W)·CE + W·KL(p‖q): KL is zero only at q = p, its gradient moves
q towards p, masked rows count for nothing, W = 0 is the old CE loss, and the teacher logits
come from the position before each block token (the target's prediction of the same token)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from blockspec.train import distill as KD
from blockspec.train import drafter as TD
from blockspec.train.masks import block_input_ids, block_positions, block_targets, training_attention_mask


def logits(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


def test_kl_is_zero_at_q_equal_p_and_positive_elsewhere():
    p = logits(6, 11)
    torch.testing.assert_close(KD.kl_from_logits(p, p), torch.zeros(6), atol=1e-6, rtol=0)
    torch.testing.assert_close(KD.kl_from_logits(p, p + 3.0), torch.zeros(6), atol=1e-5, rtol=0)  # shift-invariant
    kl = KD.kl_from_logits(p, logits(6, 11, seed=1))
    assert (kl > 1e-3).all()
    # Against a direct Σ p log(p/q).
    pp, qq = F.softmax(p, -1), F.softmax(logits(6, 11, seed=1), -1)
    torch.testing.assert_close(kl, (pp * (pp / qq).log()).sum(-1), rtol=1e-5, atol=1e-6)


def test_kl_gradient_moves_q_towards_p():
    p = logits(4, 9)
    q = logits(4, 9, seed=2).requires_grad_(True)
    KD.kl_from_logits(p, q).sum().backward()
    # d KL(p‖softmax(z)) / dz = softmax(z) − p
    torch.testing.assert_close(q.grad, F.softmax(q.detach(), -1) - F.softmax(p, -1), rtol=1e-5, atol=1e-6)
    stepped = q.detach() - 0.5 * q.grad
    assert (KD.kl_from_logits(p, stepped) < KD.kl_from_logits(p, q.detach())).all()


def test_weight_zero_is_cross_entropy_and_one_is_kl():
    q, p = logits(2, 5, 13), logits(2, 5, 13, seed=3)
    targets = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(4))
    w = torch.rand(2, 5, generator=torch.Generator().manual_seed(5))
    ce = F.cross_entropy(q.reshape(-1, 13), targets.reshape(-1), reduction="none").reshape(2, 5)
    kl = KD.kl_from_logits(p, q)
    assert torch.equal(KD.block_distill_loss(q, targets, w), (ce * w).sum() / w.sum())
    torch.testing.assert_close(KD.block_distill_loss(q, targets, w, p, 1.0), (kl * w).sum() / w.sum())
    mixed = KD.block_distill_loss(q, targets, w, p, 0.25)
    torch.testing.assert_close(mixed, ((0.75 * ce + 0.25 * kl) * w).sum() / w.sum())
    assert KD.block_distill_loss(p, targets, w, p, 1.0) < 1e-6     # q = p: nothing left to learn


def test_masked_rows_are_ignored():
    q, p = logits(3, 4, 7), logits(3, 4, 7, seed=6)
    targets = torch.randint(0, 7, (3, 4), generator=torch.Generator().manual_seed(7))
    w = torch.ones(3, 4)
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(8)) > 0.4
    garbage_q, garbage_p = q.clone(), p.clone()
    garbage_q[~mask] = 1e4 * logits(int((~mask).sum()), 7, seed=9)
    garbage_p[~mask] = -1e4
    garbage_q.requires_grad_(True)
    loss = KD.block_distill_loss(garbage_q, targets, w, garbage_p, 0.5, mask)
    torch.testing.assert_close(loss, KD.block_distill_loss(q[mask], targets[mask], w[mask], p[mask], 0.5))
    loss.backward()
    assert torch.isfinite(loss) and (garbage_q.grad[~mask] == 0).all() and garbage_q.grad[mask].abs().sum() > 0


@pytest.mark.parametrize("w", [-0.1, 1.5, float("nan")])
def test_bad_kl_weight_is_refused(w):
    with pytest.raises(ValueError, match="kl_weight"):
        KD.block_distill_loss(logits(2, 3), torch.zeros(2, dtype=torch.long), torch.ones(2), logits(2, 3), w)


def test_kl_needs_teacher_logits():
    with pytest.raises(ValueError, match="teacher_logits"):
        KD.block_distill_loss(logits(2, 3), torch.zeros(2, dtype=torch.long), torch.ones(2), None, 0.5)


def test_teacher_logits_are_the_targets_prediction_of_each_block_token(qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32)
    frozen = TD.FrozenTarget(model, (0, 1))
    B = 4
    tokens = torch.randint(0, 500, (2, 14), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([[0, 5], [3, 11]])
    targets, trained = block_targets(tokens, torch.ones_like(tokens), anchors, B)
    blocks = TD.BlockBatch(anchors, torch.ones_like(anchors, dtype=torch.bool),
                           block_input_ids(tokens.gather(-1, anchors), B, 511), block_positions(anchors, B),
                           targets, trained, training_attention_mask(anchors, B, tokens.shape[1]))
    _, final = frozen.features(tokens, with_final=True)
    teacher = KD.teacher_block_logits(final, blocks.block_pos, trained, frozen.lm_head_weight)
    with torch.no_grad():
        full = model(tokens).logits                                  # [2, 14, V]: position t predicts t + 1
    rows, cols = trained.nonzero(as_tuple=True)
    predicted = blocks.block_pos[rows, cols]                         # the token each trained position predicts
    assert torch.equal(tokens[rows, predicted], targets[trained])
    torch.testing.assert_close(teacher, full[rows, predicted - 1], rtol=1e-4, atol=1e-4)


def test_drafter_loss_mixes_ce_and_kl_against_the_full_target(qwen3_dir):
    """drafter_loss with kl_weight 0 is the weighted CE of the drafter's block logits; with W it
    adds W·KL against the target's own logits of the same tokens (from a plain forward)."""
    from blockspec.config import ModelConfig

    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32)
    frozen = TD.FrozenTarget(model, (0, 1))
    B, gamma = 4, 3.0
    cfg = ModelConfig.load(qwen3_dir)
    drafter = TD.build_drafter(TD.drafter_config_dict(cfg, 1, B, cfg.vocab_size - 1, [0, 1]), seed=1)
    tokens = torch.randint(0, 500, (2, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[1, 9:] = 0                                                  # a response that ends: untrained positions
    blocks = TD.make_block_batch(tokens, mask, B, cfg.vocab_size - 1, 3, torch.Generator().manual_seed(2))
    trained = blocks.trained
    assert (~trained).any()
    with torch.no_grad():
        q = TD.block_logits(drafter, frozen, tokens, blocks)[trained]
        full = model(tokens).logits
    rows, cols = trained.nonzero(as_tuple=True)
    p = full[rows, blocks.block_pos[rows, cols] - 1]
    w = TD.position_weights(B, gamma).repeat(blocks.block_ids.shape[-1] // B).expand_as(trained)[trained]
    ce = F.cross_entropy(q, blocks.targets[trained], reduction="none")
    kl = KD.kl_from_logits(p, q)
    for weight in (0.0, 0.5, 1.0):
        loss = TD.drafter_loss(drafter, frozen, tokens, blocks, B, gamma, kl_weight=weight)
        expected = (((1 - weight) * ce + weight * kl) * w).sum() / w.sum()
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    loss.backward()
    assert drafter.fc.weight.grad.abs().sum() > 0
