"""Random DFlash drafters written in z-lab's checkpoint format, for tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from blockspec.config import ModelConfig
from blockspec.models.dflash import DFlashConfig, DFlashDrafter


def write_dflash_drafter(out_dir, target_dir, *, block_size=8, num_layers=2, target_layer_ids=None,
                         prefix="", seed=0, std=0.1, hidden_size=None, vocab_size=None,
                         layer_types=None, sliding_window=None) -> Path:
    """A random drafter for the target in `target_dir`, saved as z-lab does.

    `prefix="model."` writes weight names with the optional prefix; sizes may be overridden
    to build drafters that do not fit their target.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = ModelConfig.load(target_dir)
    mask_id = target.vocab_size - 1
    dflash_cfg = {"mask_token_id": mask_id}
    if target_layer_ids is not None:
        dflash_cfg["target_layer_ids"] = list(target_layer_ids)
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "num_target_layers": target.num_layers,
        "num_hidden_layers": num_layers,
        "hidden_size": hidden_size or target.hidden_size,
        "intermediate_size": 2 * (hidden_size or target.hidden_size),
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": target.rope.theta,
        "vocab_size": vocab_size or target.vocab_size,
        "max_position_embeddings": target.max_position_embeddings,
        "tie_word_embeddings": False,
        "dflash_config": dflash_cfg,
    }
    if layer_types is not None:
        cfg["layer_types"] = list(layer_types)
        cfg["sliding_window"] = sliding_window
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.manual_seed(seed)
    model = DFlashDrafter(DFlashConfig.from_hf(cfg, target.num_layers))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, std)
    state = {prefix + k: v.contiguous() for k, v in model.state_dict().items() if "rotary" not in k}
    save_file(state, str(out / "model.safetensors"))
    return out
