"""Model configuration read from a Hugging Face `config.json`.

Two conventions exist for RoPE: older configs put `rope_theta` and `rope_scaling` at the top
level, newer ones (transformers ≥ 5) put both in `rope_parameters`. Both are accepted.
The DeepSeek-V3 (MLA) family's config is `config_deepseek.py`; the routing settings every
mixture-of-experts family shares are `MoEConfig` here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# The Llama family this config describes (Qwen3-MoE: Qwen3 attention, routed experts);
# models/registry.py maps names to families.
LLAMA_FAMILY = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
LLAMA_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "qwen3_moe": "Qwen3MoeForCausalLM"}
ROPE_TYPES = ("default", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # "default" | "llama3" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # YaRN (transformers' defaults): the frequency ramp's rotation bounds, the cos/sin scale
    # (`attention_factor`, else derived from mscale / mscale_all_dim) and, for MLA, the
    # softmax-scale correction from mscale_all_dim.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, cfg: dict) -> "RopeConfig":
        params = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or {}
        merged = {**scaling, **params}
        theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported ({', '.join(ROPE_TYPES)})")
        max_pos = cfg.get("max_position_embeddings", 8192)
        original = int(merged.get("original_max_position_embeddings", max_pos))
        factor = merged.get("factor")
        if factor is None:   # transformers' YaRN: the ratio of the extended to the original context
            factor = max_pos / original if rope_type == "yarn" else 1.0

        def optional(key):
            return None if merged.get(key) is None else float(merged[key])
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(factor),
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original,
            beta_fast=float(merged.get("beta_fast") or 32.0),
            beta_slow=float(merged.get("beta_slow") or 1.0),
            mscale=optional("mscale"),
            mscale_all_dim=optional("mscale_all_dim"),
            attention_factor=optional("attention_factor"),
            truncate=bool(merged.get("truncate", True)),
        )


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts of one MoE layer (shared by Qwen3-MoE and DeepSeek-V3 / Kimi K2).

    scoring "softmax" (Qwen3-MoE) or "sigmoid" (DeepSeek-V3, with `correction_bias`: the
    `e_score_correction_bias` that is added for choosing experts only, never to the weights);
    `num_groups`/`topk_groups`: experts split into groups, a token chooses among the experts
    of its best `topk_groups` groups (a group scores the sum of its two best experts).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    scoring: str = "softmax"
    correction_bias: bool = False
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    num_groups: int = 1
    topk_groups: int = 1
    num_shared_experts: int = 0

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE scoring must be softmax or sigmoid, got {self.scoring!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.top_k} must be between 1 and the {self.num_experts} experts")
        if self.num_experts % self.num_groups or not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(f"n_group {self.num_groups} must divide the {self.num_experts} experts and "
                             f"topk_group {self.topk_groups} must be between 1 and n_group")
        if self.num_groups > 1 and self.num_experts // self.num_groups < 2:
            raise ValueError("group-limited routing scores a group by its two best experts: "
                             "each group needs at least 2 experts")



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
    moe: MoEConfig | None = None          # Qwen3-MoE: the routed experts of `moe_layers`
    moe_layers: tuple[int, ...] = ()      # layers whose MLP is `moe` (the others: dense SwiGLU)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else LLAMA_MODEL_TYPES.get(cfg.get("model_type", ""), "")
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
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            **(_qwen3_moe(cfg) if arch == "Qwen3MoeForCausalLM" else {}),
            raw=cfg,
        )

    @classmethod
    def load(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}")
        return cls.from_hf(json.loads(path.read_text()))


def _qwen3_moe(cfg: dict) -> dict:
    """Qwen3-MoE's experts and which layers have them (transformers' defaults where absent):
    layer i is sparse unless listed in `mlp_only_layers`, when (i + 1) % decoder_sparse_step == 0."""
    experts = int(cfg.get("num_experts", cfg.get("num_local_experts", 128)))
    step = int(cfg.get("decoder_sparse_step", 1))
    dense = set(cfg.get("mlp_only_layers") or [])
    layers = int(cfg["num_hidden_layers"])
    moe_layers = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    moe = MoEConfig(num_experts=experts, top_k=int(cfg.get("num_experts_per_tok", 8)),
                    intermediate_size=int(cfg.get("moe_intermediate_size", 768)), scoring="softmax",
                    norm_topk_prob=bool(cfg.get("norm_topk_prob", False))) if moe_layers else None
    return {"moe": moe, "moe_layers": moe_layers}
