"""DeepSeek-V3 / Kimi K2 configuration (`DeepseekV3ForCausalLM`, model_type deepseek_v3 or kimi_k2).

Multi-head latent attention (MLA) and routed experts after `first_k_dense_replace` dense
layers. Keys absent from config.json take transformers' `DeepseekV3Config` defaults, so that a
checkpoint means the same thing here as there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockspec.config import MoEConfig, RopeConfig

DEEPSEEK_MODEL_TYPES = {"deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM"}


@dataclass(frozen=True)
class DeepseekV3Config:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int          # the dense layers' MLP
    num_layers: int
    num_heads: int
    q_lora_rank: int | None         # None: q is one projection (`q_proj`)
    kv_lora_rank: int               # the latent every head's keys and values are made from
    qk_nope_head_dim: int
    qk_rope_head_dim: int           # the rotary part of a key: one per token, shared by the heads
    v_head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    rope_interleave: bool           # DeepSeek's pairs (x0, x1), (x2, x3), … rotated together
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    first_k_dense_replace: int
    moe: MoEConfig
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        """The rotary dimension (transformers sets this family's `head_dim` to it)."""
        return self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(range(self.first_k_dense_replace, self.num_layers))

    @classmethod
    def from_hf(cls, cfg: dict) -> "DeepseekV3Config":
        scoring = cfg.get("scoring_func", "sigmoid")
        method = cfg.get("topk_method", "noaux_tc")
        if scoring != "sigmoid" or method != "noaux_tc":
            # What transformers' DeepseekV3 computes, and so what is verified against it.
            raise ValueError(f"DeepseekV3ForCausalLM routes with scoring_func 'sigmoid' and topk_method "
                             f"'noaux_tc'; this config has {scoring!r} / {method!r}")
        if int(cfg.get("moe_layer_freq", 1) or 1) != 1:
            raise ValueError(f"moe_layer_freq {cfg['moe_layer_freq']} is not supported: every layer after "
                             "first_k_dense_replace is a MoE layer (as in transformers' DeepseekV3)")
        heads = int(cfg.get("num_attention_heads", 128))
        experts = int(cfg.get("n_routed_experts", 256))
        moe = MoEConfig(
            num_experts=experts, top_k=int(cfg.get("num_experts_per_tok") or 8),
            intermediate_size=int(cfg.get("moe_intermediate_size", 2048)), scoring="sigmoid",
            correction_bias=True, norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 2.5)),
            num_groups=int(cfg.get("n_group") or 8), topk_groups=int(cfg.get("topk_group") or 4),
            num_shared_experts=int(cfg.get("n_shared_experts", 1) or 0))
        q_lora = cfg.get("q_lora_rank", 1536)
        eos = cfg.get("eos_token_id", 1)
        eos_ids = tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        rope_cfg = {**cfg, "max_position_embeddings": cfg.get("max_position_embeddings", 4096)}
        return cls(
            architecture="DeepseekV3ForCausalLM",
            vocab_size=int(cfg.get("vocab_size", 129280)),
            hidden_size=int(cfg.get("hidden_size", 7168)),
            intermediate_size=int(cfg.get("intermediate_size", 18432)),
            num_layers=int(cfg.get("num_hidden_layers", 61)),
            num_heads=heads,
            q_lora_rank=None if q_lora is None else int(q_lora),
            kv_lora_rank=int(cfg.get("kv_lora_rank", 512)),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim", 128)),
            qk_rope_head_dim=int(cfg.get("qk_rope_head_dim", 64)),
            v_head_dim=int(cfg.get("v_head_dim") or 128),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(rope_cfg),
            rope_interleave=bool(cfg.get("rope_interleave", True)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            first_k_dense_replace=int(cfg.get("first_k_dense_replace", 3) or 0),
            moe=moe,
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            raw=cfg,
        )
