"""Random DFlash drafters written in z-lab's checkpoint format, for tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from types import SimpleNamespace

from blockspec.models.dflash import DFlashConfig, DFlashDrafter
from blockspec.models.registry import load_config
from blockspec.train.drafter import drafter_config_dict


def write_dflash_drafter(out_dir, target_dir, *, block_size=8, num_layers=2, target_layer_ids=None,
                         prefix="", seed=0, std=0.1, hidden_size=None, vocab_size=None,
                         layer_types=None, sliding_window=None) -> Path:
    """A random drafter for the target in `target_dir`, saved as z-lab does.

    `prefix="model."` writes weight names with the optional prefix; sizes may be overridden
    to build drafters that do not fit their target.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = load_config(target_dir)
    if not hasattr(target, "num_kv_heads"):
        # An MLA target (DeepSeek-V3 / Kimi): the drafter has its own GQA attention sizes.
        target = SimpleNamespace(**{f: getattr(target, f) for f in (
            "num_layers", "hidden_size", "intermediate_size", "num_heads", "rms_norm_eps", "rope", "vocab_size",
            "max_position_embeddings")}, num_kv_heads=2, head_dim=16)
    mask_id = target.vocab_size - 1
    cfg = drafter_config_dict(target, num_layers, block_size, mask_id)
    # Written as z-lab checkpoints may be: without target_layer_ids (defaults apply) and, for
    # refusal tests, with sizes or ids that do not fit the target.
    if target_layer_ids is None:
        del cfg["dflash_config"]["target_layer_ids"]
    else:
        cfg["dflash_config"]["target_layer_ids"] = list(target_layer_ids)
    cfg["hidden_size"] = hidden_size or target.hidden_size
    cfg["intermediate_size"] = 2 * cfg["hidden_size"]
    cfg["vocab_size"] = vocab_size or target.vocab_size
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
