"""The layers a tensor-parallel shard swaps in (Megatron-style), each keeping the parameter
names of the layer it replaces so a checkpoint's names load unchanged.

Column-parallel layers (q/k/v, gate/up, MLA's q_b/kv_b) need no class of their own: they are
plain `nn.Linear`s holding this rank's output rows, so merging them (`layers/linear.py`) merges
the shards. The other side of each block sums partial products once (`RowParallelLinear`,
`ShardedMoE`); the vocabulary is split by rows (`VocabParallelEmbedding`, `VocabParallelHead`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blockspec.layers.moe import MoE, GroupedExperts
from blockspec.parallel.group import Group


class RowParallelLinear(nn.Linear):
    """`weight [out, in/N]`: this rank's input columns; the output `[…, out]` is all-reduced
    (one all-reduce per o_proj / down_proj). The bias is held by rank 0 only (zeros elsewhere,
    `sharding.py`), so the sum adds it once."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: Group, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(F.linear(x, self.weight, self.bias).contiguous())


class VocabParallelEmbedding(nn.Module):
    """`weight [V_shard, H]`: token ids [start, start + V_shard) of the vocabulary (the last
    shard padded with zero rows). ids `[…]` → `[…, H]`: each rank embeds its own ids, zeros for
    the others, and the sum is all-reduced (one nonzero term per token: exact)."""

    def __init__(self, shard_rows: int, hidden: int, start: int, vocab_size: int, group: Group, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shard_rows, hidden, device=device))
        self.start, self.vocab_size, self.group = start, vocab_size, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)
        return self.group.all_reduce(out * mine[..., None].to(out.dtype))


class VocabParallelHead(nn.Module):
    """`weight [V_shard, H]` (tied: the embedding's own shard). hidden `[…, H]` → the logits of
    the whole vocabulary `[…, V]`: each rank's `[…, V_shard]` all-gathered, padding cut, so
    sampling sees exactly TP=1's logits layout."""

    def __init__(self, shard_rows: int, hidden: int, vocab_size: int, group: Group, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shard_rows, hidden, device=device))
        self.vocab_size, self.group = vocab_size, group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather(F.linear(hidden, self.weight), dim=-1)[..., :self.vocab_size]


class LocalExperts(GroupedExperts):
    """Expert parallel: experts [offset, offset + E_local) of the full set. ids/weights `[T, k]`
    use the global ids; pairs routed to another rank's experts get weight 0 (their product is
    computed with local expert 0 and dropped: no host sync, fixed shapes)."""

    def __init__(self, hidden: int, cfg, offset: int):
        super().__init__(hidden, cfg)
        self.offset = offset

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        local = ids - self.offset
        mine = (local >= 0) & (local < self.num_experts)
        return super().forward(x, torch.where(mine, local, torch.zeros_like(local)), weights * mine)


class ShardedMoE(MoE):
    """A mixture of experts whose routed experts are split (each expert's intermediate across
    ranks, or whole experts per rank with `LocalExperts`) and whose shared experts are split by
    intermediate; routing is replicated. The rank's partial output is all-reduced once."""

    def __init__(self, moe: MoE, group: Group):
        nn.Module.__init__(self)
        self.gate, self.experts, self.shared_experts = moe.gate, moe.experts, moe.shared_experts
        self.expert_hits = None
        self.group = group

    def record_expert_hits(self) -> None:
        """`expert_hits` over the full expert set (routing is replicated, so every rank's is whole)."""
        self.expert_hits = torch.zeros(self.gate.cfg.num_experts, dtype=torch.bool, device=self.gate.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().forward(x).contiguous())
