"""Model configuration read from a Hugging Face `config.json`.

Two conventions exist for RoPE: older configs put `rope_theta` and `rope_scaling` at the top
level, newer ones (transformers ≥ 5) put both in `rope_parameters`. Both are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# The Llama family this config describes; models/registry.py maps names to families.
LLAMA_FAMILY = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # "default" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, cfg: dict) -> "RopeConfig":
        params = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or {}
        merged = {**scaling, **params}
        theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type {rope_type!r} is not supported (default, llama3)")
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(merged.get("factor", 1.0)),
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(merged.get("original_max_position_embeddings",
                                                          cfg.get("max_position_embeddings", 8192))),
        )


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                       "qwen3": "Qwen3ForCausalLM"}.get(cfg.get("model_type", ""), "")
        if arch not in LLAMA_FAMILY:
            raise ValueError(f"architecture {arch!r} is not supported; supported: {', '.join(LLAMA_FAMILY)}")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        attention_bias = bool(cfg.get("attention_bias", False))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v bias and no o bias; Llama's attention_bias covers all four.
            qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
            o_bias=arch != "Qwen2ForCausalLM" and attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            raw=cfg,
        )

    @classmethod
    def load(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        return cls.from_hf(json.loads(path.read_text()))
