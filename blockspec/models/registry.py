"""Architecture name → how to read its config and build its model.

The engine asks the registry, never a family module, so adding a family (MLA, MoE) is one entry
here plus its module. The model itself says how its K/V cache is laid out (`model.cache_spec`).
A multimodal wrapper (Kimi K2.5's `kimi_k25`) is one `Wrapper` entry: its text config names the
registered text architecture, and the loader maps its weight names (`models/loader.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from blockspec.config import LLAMA_FAMILY, LLAMA_MODEL_TYPES, ModelConfig
from blockspec.config_deepseek import DEEPSEEK_MODEL_TYPES, DeepseekV3Config


@dataclass(frozen=True)
class Architecture:
    name: str
    parse_config: Callable[[dict], object]     # config.json dict → the family's config
    model_class: Callable[[], type]            # imported lazily: configs load without torch models


def _llama():
    from blockspec.models.llama import LlamaForCausalLM
    return LlamaForCausalLM


def _deepseek_v3():
    from blockspec.models.deepseek_v3 import DeepseekV3ForCausalLM
    return DeepseekV3ForCausalLM


ARCHITECTURES: dict[str, Architecture] = {
    **{name: Architecture(name, ModelConfig.from_hf, _llama) for name in LLAMA_FAMILY},
    "DeepseekV3ForCausalLM": Architecture("DeepseekV3ForCausalLM", DeepseekV3Config.from_hf, _deepseek_v3),
}
MODEL_TYPES = {**LLAMA_MODEL_TYPES, **DEEPSEEK_MODEL_TYPES}


@dataclass(frozen=True)
class Wrapper:
    """A multimodal checkpoint around a registered text model: `config[text_config]` is the text
    model's config.json, the text model's weights are named under `text_prefix`, and weights
    under `skipped_prefixes` (vision tower, projector) are not loaded: blockspec serves text."""
    name: str
    text_config: str
    text_prefix: str
    skipped_prefixes: tuple[str, ...]


WRAPPERS: dict[str, Wrapper] = {
    "KimiK25ForConditionalGeneration": Wrapper("KimiK25ForConditionalGeneration", "text_config", "language_model.",
                                               ("vision_tower.", "mm_projector.", "multi_modal_projector.")),
}
WRAPPER_MODEL_TYPES = {"kimi_k25": "KimiK25ForConditionalGeneration"}


def wrapper_of(raw: dict) -> Wrapper | None:
    """The wrapper a config.json names (or implies by model_type), if it is one."""
    archs = raw.get("architectures") or []
    name = archs[0] if archs else WRAPPER_MODEL_TYPES.get(raw.get("model_type", ""), "")
    return WRAPPERS.get(name)


def text_config_of(raw: dict) -> dict:
    """The text model's config: `raw` itself, or a wrapper's text config (which takes the
    wrapper's eos_token_id when it has none of its own)."""
    wrapper = wrapper_of(raw)
    if wrapper is None:
        return raw
    text = raw.get(wrapper.text_config)
    if not isinstance(text, dict):
        raise ValueError(f"config.json: {wrapper.name} needs a '{wrapper.text_config}' object")
    text = dict(text)
    if "eos_token_id" not in text and "eos_token_id" in raw:
        text["eos_token_id"] = raw["eos_token_id"]
    return text


def architecture_of(raw: dict) -> Architecture:
    """The registered architecture a config.json names (or implies by model_type)."""
    archs = raw.get("architectures") or []
    name = archs[0] if archs else MODEL_TYPES.get(raw.get("model_type", ""), "")
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture {name!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def read_config(model_dir: str | Path) -> dict:
    """`model_dir/config.json` as a dict."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    return json.loads(path.read_text())


def parse_config(raw: dict):
    """A config.json dict (a wrapper's: its text config) as its family's config."""
    text = text_config_of(raw)
    return architecture_of(text).parse_config(text)


def load_config(model_dir: str | Path):
    """Read `model_dir/config.json` into its family's config."""
    return parse_config(read_config(model_dir))


def model_class_for(cfg) -> type:
    return ARCHITECTURES[cfg.architecture].model_class()
