"""train-drafter --init: a drafter starts from another's weights, and a mismatch is refused."""

import pytest
import torch

from blockspec.config import ModelConfig
from blockspec.train.drafter import build_drafter, drafter_config_dict, init_from, save_drafter


def test_init_copies_weights_and_refuses_mismatch(qwen3_dir, tmp_path):
    target = ModelConfig.load(qwen3_dir)
    cfg = drafter_config_dict(target, 1, 8, target.vocab_size - 1)
    source = build_drafter(cfg, seed=1)
    save_drafter(source, cfg, tmp_path / "src")
    fresh = build_drafter(cfg, seed=2)
    assert not torch.equal(fresh.fc.weight, source.fc.weight)
    init_from(fresh, cfg, tmp_path / "src")
    for (k, a), (_, b) in zip(fresh.state_dict().items(), source.state_dict().items()):
        assert torch.equal(a, b), k
    other = drafter_config_dict(target, 2, 8, target.vocab_size - 1)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        init_from(build_drafter(other, seed=0), other, tmp_path / "src")
