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


def test_merged_drafter_projections_match_separate(qwen3_dir, tmp_path):
    """The drafter's merged block q/k/v and context k/v (CUDA fast path) give its hidden states."""
    from dflash_fixtures import write_dflash_drafter
    from blockspec.config import ModelConfig
    from blockspec.models.dflash import load_drafter
    from blockspec.models.fast_path import prepare_drafter_for_cuda, probe_drafter
    draft_dir = write_dflash_drafter(tmp_path / "d", qwen3_dir, num_layers=2)
    target = ModelConfig.load(qwen3_dir)
    separate = load_drafter(draft_dir, target, torch.float32, torch.device("cpu"))
    merged = load_drafter(draft_dir, target, torch.float32, torch.device("cpu"))
    prepare_drafter_for_cuda(merged, fused_ops=False)
    attn = merged.layers[0].self_attn
    assert attn.qkv_proj is not None and attn.kv_proj is not None and not hasattr(attn, "q_proj")
    assert merged.layers[0].mlp.gate_up_proj is not None
    torch.testing.assert_close(probe_drafter(merged), probe_drafter(separate), rtol=1e-5, atol=1e-5)


def test_merging_twice_is_a_no_op(qwen2_dir):
    """A drafter shared by several proposers (bench step) is prepared once per proposer."""
    model = load_target(qwen2_dir, "float32", "cpu")
    model.merge_projections()
    merged = model.model.layers[0].self_attn.qkv_proj
    model.merge_projections()
    assert model.model.layers[0].self_attn.qkv_proj is merged


def test_merged_mla_projections_match_separate(deepseek_dir):
    """DeepSeek-V3: q_a and the KV latent's projection as one product; dense and shared-expert
    gate/up too."""
    from test_models_moe import our_logits as moe_logits
    separate = load_target(deepseek_dir, "float32", "cpu")
    merged = load_target(deepseek_dir, "float32", "cpu")
    merged.merge_projections()
    attn = merged.model.layers[1].self_attn
    assert attn.q_kv_a_proj is not None and not hasattr(attn, "kv_a_proj_with_mqa")
    assert merged.model.layers[1].mlp.shared_experts.gate_up_proj is not None
    ids = torch.randint(0, separate.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(moe_logits(merged, ids)[0], moe_logits(separate, ids)[0], rtol=1e-5, atol=1e-5)
