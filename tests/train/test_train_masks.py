"""Block layout of DFlash training against loop references written from the rule in docs/dflash.md (Training)."""

import math

import pytest
import torch

from blockspec.train.drafter import loss_decay_gamma, position_weights
from blockspec.train.masks import (anchor_candidates, block_input_ids, block_positions, block_targets,
                                   sample_anchors, training_attention_mask)


def loop_mask(anchors: list[int], block_size: int, seq_len: int) -> torch.Tensor:
    """The rule, one entry at a time: context strictly before the anchor, own block, nothing else."""
    n = len(anchors)
    mask = torch.zeros(n * block_size, seq_len + n * block_size, dtype=torch.bool)
    for q in range(n * block_size):
        block = q // block_size
        for j in range(seq_len):
            mask[q, j] = j < anchors[block]
        for m in range(n * block_size):
            mask[q, seq_len + m] = m // block_size == block
    return mask


@pytest.mark.parametrize("anchors, block_size, seq_len", [
    ([0, 3, 9], 4, 10),        # the first position and one at the very end (block runs past T)
    ([1], 16, 5),              # a block longer than the sequence
    ([2, 2, 7, 11], 3, 12),    # repeated anchors stay separate blocks
])
def test_training_attention_mask_matches_rule(anchors, block_size, seq_len):
    got = training_attention_mask(torch.tensor(anchors), block_size, seq_len)
    assert got.dtype == torch.bool
    assert torch.equal(got, loop_mask(anchors, block_size, seq_len))


def test_training_attention_mask_batched():
    anchors = torch.tensor([[0, 5], [3, 7]])
    got = training_attention_mask(anchors, 4, 9)
    assert got.shape == (2, 8, 9 + 8)
    for row in range(2):
        assert torch.equal(got[row], loop_mask(anchors[row].tolist(), 4, 9))


def test_block_positions_and_inputs():
    anchors = torch.tensor([[2, 6]])
    assert block_positions(anchors, 3).tolist() == [[2, 3, 4, 6, 7, 8]]
    ids = block_input_ids(torch.tensor([[40, 41]]), 3, mask_token_id=99)
    assert ids.tolist() == [[40, 99, 99, 41, 99, 99]]


def loop_targets(ids, mask, anchors, valid, block_size):
    targets, trained = [], []
    for a, ok in zip(anchors, valid):
        inside = True
        for k in range(block_size):
            pos = a + k
            targets.append(ids[min(pos, len(ids) - 1)])
            if k == 0:
                trained.append(False)
                continue
            inside = inside and pos < len(ids) and mask[pos]
            trained.append(bool(ok and inside))
    return targets, trained


def test_block_targets_stop_at_the_end_of_the_response():
    ids = list(range(100, 112))
    # response 2..5, user turn 6..7, response 8..11 (the sequence ends inside it)
    mask = [False, False, True, True, True, True, False, False, True, True, True, True]
    anchors, valid = [2, 4, 9, 10, 0], [True, True, True, True, False]
    targets, trained = block_targets(torch.tensor([ids]), torch.tensor([mask]), torch.tensor([anchors]), 4,
                                     torch.tensor([valid]))
    ref_t, ref_tr = loop_targets(ids, mask, anchors, valid, 4)
    assert targets[0].tolist() == ref_t
    assert trained[0].tolist() == ref_tr
    # anchor 4: predicts 5 (response), then 6 leaves it — and 8 (the next reply) must not count
    assert trained[0, 4:8].tolist() == [False, True, False, False]


def test_sample_anchors_are_distinct_candidates():
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[0, 5:15] = True      # 9 candidates (5..13)
    mask[1, 18:] = True       # 1 candidate (18)
    mask[2, :] = True         # 19 candidates
    gen = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(mask, 6, gen)
    candidates = anchor_candidates(mask)
    assert anchors.shape == (3, 6)
    assert valid.sum(-1).tolist() == [6, 1, 6]
    for row in range(3):
        picked = anchors[row][valid[row]].tolist()
        assert len(set(picked)) == len(picked) and picked == sorted(picked)
        assert all(candidates[row, a] for a in picked)
    assert anchors[1, valid[1]].tolist() == [18]
    again, _ = sample_anchors(mask, 6, torch.Generator().manual_seed(0))
    assert torch.equal(anchors, again)


def test_sample_anchors_cover_all_candidates_uniformly():
    mask = torch.ones(1, 12, dtype=torch.bool)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(12)
    for _ in range(600):
        anchors, _ = sample_anchors(mask, 2, gen)
        counts[anchors[0]] += 1
    assert counts[-1] == 0                      # the last token starts no block
    assert counts[:-1].min() > 600 * 2 / 11 * 0.6


def test_loss_decay():
    assert loss_decay_gamma(16) == pytest.approx(7)
    assert loss_decay_gamma(10) == pytest.approx(5)
    assert loss_decay_gamma(8) == pytest.approx(4)
    assert 5 < loss_decay_gamma(12) < 7
    w = position_weights(16, 7.0)
    assert w[0] == 0 and w[1] == pytest.approx(1.0) and w[15] == pytest.approx(math.exp(-14 / 7))
