"""Merged q/k/v projections (the CUDA fast path) compute what the separate ones do."""

from __future__ import annotations

import torch

from blockspec.models.loader import load_target
from test_models import our_logits


def test_merged_projections_match_separate(qwen2_dir):
    separate = load_target(qwen2_dir, "float32", "cpu")            # Qwen2: q/k/v carry a bias
    merged = load_target(qwen2_dir, "float32", "cpu")
    merged.merge_projections()
    attn = merged.model.layers[0].self_attn
    assert attn.qkv_proj is not None and not hasattr(attn, "q_proj")
    mlp = merged.model.layers[0].mlp
    assert mlp.gate_up_proj is not None and not hasattr(mlp, "gate_proj")
    ids = torch.randint(0, separate.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(our_logits(merged, ids), our_logits(separate, ids), rtol=1e-5, atol=1e-5)
