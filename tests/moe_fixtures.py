"""Tiny mixture-of-experts checkpoints made with transformers' own classes: DeepSeek-V3 (MLA,
sigmoid group-limited routing, shared expert) and Qwen3-MoE (softmax routing). Sizes are
multiples of 8 so that grouped matrix products take them on every device."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fixtures import _write_model

DEEPSEEK_SMALL = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
                      num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
                      qk_rope_head_dim=8, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2,
                      n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                      routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=512,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)


def _correction_bias(seed: int):
    """Non-zero e_score_correction_bias (a buffer the randomization skips), so that choosing
    with it and weighting without it is tested."""
    def customize(model):
        gen = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(0.05 * torch.randn(buf.shape, generator=gen))
    return customize


def write_deepseek_v3(dir, *, vocab_size: int = 512, num_layers: int = 2, seed: int = 4,
                      model_type: str | None = None, std: float = 0.08, embed_std: float = 0.2,
                      **overrides) -> Path:
    """A tiny DeepseekV3ForCausalLM (1 dense layer, then MoE). `model_type="kimi_k2"` rewrites
    config.json as Kimi K2 ships it (the architecture stays DeepseekV3ForCausalLM)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    kwargs = {**DEEPSEEK_SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **overrides}
    out = _write_model(dir, DeepseekV3Config, DeepseekV3ForCausalLM, vocab_size=vocab_size, sharded=False,
                       num_layers=num_layers, rope_convention="new", seed=seed, std=std, embed_std=embed_std,
                       norm_std=0.1, customize=_correction_bias(seed), **kwargs)
    if model_type is not None:
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": model_type}, indent=2))
    return out


def write_qwen3_moe(dir, *, vocab_size: int = 512, num_layers: int = 2, seed: int = 5, std: float = 0.08,
                    embed_std: float = 0.2, **overrides) -> Path:
    """A tiny Qwen3MoeForCausalLM: 8 experts, top-2, renormalised; layer 1 dense (mlp_only_layers)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    kwargs = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                  mlp_only_layers=[1], max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **overrides)
    return _write_model(dir, Qwen3MoeConfig, Qwen3MoeForCausalLM, vocab_size=vocab_size, sharded=False,
                        num_layers=num_layers, rope_convention="new", seed=seed, std=std, embed_std=embed_std,
                        norm_std=0.1, **kwargs)
