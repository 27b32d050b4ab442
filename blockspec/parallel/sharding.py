"""Which slice of the model a rank holds: the modules resized on meta, and each checkpoint
tensor's slice (read by `load.py` without reading the rest).

Megatron-style: attention heads split (q/k/v by rows, o by columns; K/V heads replicated when
there are fewer than ranks, each rank keeping the head its query heads read), the MLP's
intermediate split (gate/up rows, down columns), the vocabulary split by rows (embedding and
head). A mixture of experts splits each routed expert's intermediate, or with
`expert_parallel` gives each rank whole experts; its shared experts split by intermediate and
its router is replicated. MLA (DeepSeek-V3 / Kimi K2) splits heads (q_b / q, kv_b, o); the
latent projections, and so the latent cache, are replicated on every rank.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
from torch import nn

from blockspec.layers.mlp import SwiGLU
from blockspec.layers.moe import MoE, GroupedExperts
from blockspec.parallel.group import Group
from blockspec.parallel.layers import (LocalExperts, RowParallelLinear, ShardedMoE, VocabParallelEmbedding,
                                       VocabParallelHead)


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    size: int
    expert_parallel: bool = False

    def part(self, n: int, what: str) -> tuple[int, int]:
        """Units [start, stop) of `n` that this rank holds (an even split; `what` names the field)."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) must be divisible by tensor_parallel_size ({self.size})")
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per

    def kv_part(self, num_kv_heads: int) -> tuple[int, int]:
        """K/V heads this rank keeps: an even split, or with fewer heads than ranks the one head
        its query heads read (replicated over size / num_kv_heads ranks)."""
        if num_kv_heads >= self.size:
            return self.part(num_kv_heads, "num_key_value_heads")
        if self.size % num_kv_heads:
            raise ValueError(f"tensor_parallel_size ({self.size}) must be a multiple of num_key_value_heads "
                             f"({num_kv_heads}) when it exceeds it")
        head = self.rank // (self.size // num_kv_heads)
        return head, head + 1

    def vocab_part(self, vocab_size: int) -> tuple[int, int, int]:
        """(first id, end id, shard rows): ceil(V / size) rows a rank, the last shard padded."""
        rows = -(-vocab_size // self.size)
        start = min(self.rank * rows, vocab_size)
        return start, min(start + rows, vocab_size), rows


# ---- modules, resized on meta -----------------------------------------------------------------

def _linear(rows: int, cols: int, bias: bool) -> nn.Linear:
    return nn.Linear(cols, rows, bias=bias, device="meta")


def shard_modules(model: nn.Module, plan: ShardPlan, group: Group) -> None:
    """Resize `model` (built on meta with the full config) to this rank's shard, in place, and
    swap in the parallel layers. Parameter names stay the checkpoint's."""
    cfg = model.config
    from blockspec.models.deepseek_v3 import MLAttention
    from blockspec.models.llama import LlamaAttention
    h0, h1 = plan.part(cfg.num_heads, "num_attention_heads")
    heads = h1 - h0
    if plan.expert_parallel and not any(isinstance(layer.mlp, MoE) for layer in model.model.layers):
        raise ValueError("expert_parallel needs a mixture-of-experts model")
    for layer in model.model.layers:
        attn = layer.self_attn
        if isinstance(attn, LlamaAttention):
            k0, k1 = plan.kv_part(cfg.num_kv_heads)
            hd = attn.head_dim
            attn.num_heads, attn.num_kv_heads = heads, k1 - k0
            bias = attn.q_proj.bias is not None
            attn.q_proj = _linear(heads * hd, cfg.hidden_size, bias)
            attn.k_proj = _linear((k1 - k0) * hd, cfg.hidden_size, bias)
            attn.v_proj = _linear((k1 - k0) * hd, cfg.hidden_size, bias)
        elif isinstance(attn, MLAttention):
            attn.num_heads = heads
            qk = attn.nope + attn.rope_dim
            if attn.q_lora:
                attn.q_b_proj = _linear(heads * qk, attn.q_b_proj.in_features, False)
            else:
                attn.q_proj = _linear(heads * qk, cfg.hidden_size, False)
            attn.kv_b_proj = _linear(heads * (attn.nope + attn.v_dim), attn.latent_dim, False)
        else:
            raise ValueError(f"tensor parallelism does not know attention {type(attn).__name__}")
        o = attn.o_proj
        attn.o_proj = RowParallelLinear(o.in_features // cfg.num_heads * heads, o.out_features, o.bias is not None,
                                        group, device="meta")
        layer.mlp = _shard_mlp(layer.mlp, plan, group)
    start, _, rows = plan.vocab_part(cfg.vocab_size)
    model.model.embed_tokens = VocabParallelEmbedding(rows, cfg.hidden_size, start, cfg.vocab_size, group, "meta")
    model.lm_head = VocabParallelHead(rows, cfg.hidden_size, cfg.vocab_size, group, "meta")


def _shard_swiglu(mlp: SwiGLU, plan: ShardPlan, group: Group | None, what: str) -> SwiGLU:
    """gate/up column-parallel; down row-parallel (all-reduced), or partial when `group` is None
    (a shared expert, summed with the routed experts' partial output)."""
    i0, i1 = plan.part(mlp.gate_proj.out_features, what)
    hidden, bias = mlp.gate_proj.in_features, mlp.gate_proj.bias is not None
    mlp.gate_proj = _linear(i1 - i0, hidden, bias)
    mlp.up_proj = _linear(i1 - i0, hidden, bias)
    mlp.down_proj = (RowParallelLinear(i1 - i0, hidden, bias, group, device="meta") if group is not None
                     else _linear(hidden, i1 - i0, bias))
    return mlp


def _shard_mlp(mlp: nn.Module, plan: ShardPlan, group: Group) -> nn.Module:
    if isinstance(mlp, SwiGLU):
        return _shard_swiglu(mlp, plan, group, "intermediate_size")
    if not isinstance(mlp, MoE):
        raise ValueError(f"tensor parallelism does not know MLP {type(mlp).__name__}")
    cfg = mlp.gate.cfg
    hidden = mlp.gate.weight.shape[1]
    with torch.device("meta"):
        if plan.expert_parallel:
            e0, e1 = plan.part(cfg.num_experts, "num_experts (expert_parallel)")
            mlp.experts = LocalExperts(hidden, _replace(cfg, num_experts=e1 - e0), e0)
        else:
            i0, i1 = plan.part(cfg.intermediate_size, "moe_intermediate_size")
            mlp.experts = GroupedExperts(hidden, _replace(cfg, intermediate_size=i1 - i0))
    if mlp.shared_experts is not None:
        _shard_swiglu(mlp.shared_experts, plan, None, "shared experts' intermediate_size")
    return ShardedMoE(mlp, group)


def _replace(cfg, **changes):
    """A MoEConfig with sizes changed, without re-running its checks (top_k may exceed a rank's experts)."""
    new = object.__new__(type(cfg))
    for k, v in {**cfg.__dict__, **changes}.items():
        object.__setattr__(new, k, v)
    return new


# ---- checkpoint tensors -------------------------------------------------------------------------

@dataclass(frozen=True)
class Slice:
    """Units [u0, u1) of `units` equal parts of `dim`; `pad_rows`: dim 0 padded with zeros to
    that many rows; `rank0_only`: the whole tensor on rank 0, zeros elsewhere (row-parallel biases)."""
    dim: int = 0
    units: int = 1
    u0: int = 0
    u1: int = 1
    pad_rows: int | None = None
    rank0_only: bool = False


FULL = Slice()
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def checkpoint_slice(name: str, cfg, plan: ShardPlan) -> tuple[str, Slice] | None:
    """The model name and slice of checkpoint tensor `name` on this rank; None: not loaded here
    (another rank's expert, DeepSeek's multi-token-prediction layers)."""
    V = cfg.vocab_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        start, end, rows = plan.vocab_part(V)
        return name, Slice(0, V, start, end, pad_rows=rows)
    m = _LAYER.match(name)
    if m is None:
        return name, FULL
    index, rest = int(m[1]), m[2]
    if index >= cfg.num_layers:
        return None
    H = cfg.num_heads
    h0, h1 = plan.part(H, "num_attention_heads")
    part = rest.rsplit(".", 1)[0]
    is_bias = rest.endswith(".bias")
    if part in ("self_attn.q_proj", "self_attn.q_b_proj", "self_attn.kv_b_proj"):
        return name, Slice(0, H, h0, h1)
    if part in ("self_attn.k_proj", "self_attn.v_proj"):
        k0, k1 = plan.kv_part(cfg.num_kv_heads)
        return name, Slice(0, cfg.num_kv_heads, k0, k1)
    if part == "self_attn.o_proj":
        return name, Slice(rank0_only=True) if is_bias else Slice(1, H, h0, h1)
    if part in ("mlp.gate_proj", "mlp.up_proj"):
        return name, Slice(0, plan.size, plan.rank, plan.rank + 1)
    if part == "mlp.down_proj":
        return name, Slice(rank0_only=True) if is_bias else Slice(1, plan.size, plan.rank, plan.rank + 1)
    if part in ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"):
        return name, Slice(0, plan.size, plan.rank, plan.rank + 1)
    if part == "mlp.shared_experts.down_proj":
        return name, Slice(1, plan.size, plan.rank, plan.rank + 1)
    if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
        raise ValueError(f"{name}: checkpoints with stacked experts are not sharded yet; "
                         "tensor_parallel_size needs one matrix per expert")
    e = _EXPERT.match(rest)
    if e is not None:
        expert, proj = int(e[1]), e[2]
        if plan.expert_parallel:
            e0, e1 = plan.part(cfg.moe.num_experts, "num_experts (expert_parallel)")
            if not e0 <= expert < e1:
                return None
            return f"model.layers.{index}.mlp.experts.{expert - e0}.{proj}.weight", FULL
        dim = 1 if proj == "down_proj" else 0
        return name, Slice(dim, plan.size, plan.rank, plan.rank + 1)
    return name, FULL


def shard_cache_spec(shard: nn.Module):
    """A rank's cache layout: its K/V heads (a latent cache is the full one, replicated)."""
    spec = shard.cache_spec
    if hasattr(spec, "num_kv_heads"):
        return dataclasses.replace(spec, num_kv_heads=shard.model.layers[0].self_attn.num_kv_heads)
    return spec
