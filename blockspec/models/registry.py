"""Architecture name → how to read its config and build its model.

The engine asks the registry, never a family module, so adding a family (MLA, MoE) is one entry
here plus its module. The model itself says how its K/V cache is laid out (`model.cache_spec`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from blockspec.config import ModelConfig


@dataclass(frozen=True)
class Architecture:
    name: str
    parse_config: Callable[[dict], object]     # config.json dict → the family's config
    model_class: Callable[[], type]            # imported lazily: configs load without torch models


def _llama():
    from blockspec.models.llama import LlamaForCausalLM
    return LlamaForCausalLM


ARCHITECTURES: dict[str, Architecture] = {
    name: Architecture(name, ModelConfig.from_hf, _llama)
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def architecture_of(raw: dict) -> Architecture:
    """The registered architecture a config.json names (or implies by model_type)."""
    archs = raw.get("architectures") or []
    name = archs[0] if archs else MODEL_TYPES.get(raw.get("model_type", ""), "")
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture {name!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def load_config(model_dir: str | Path):
    """Read `model_dir/config.json` into its family's config."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    raw = json.loads(path.read_text())
    return architecture_of(raw).parse_config(raw)


def model_class_for(cfg) -> type:
    return ARCHITECTURES[cfg.architecture].model_class()
