"""Mixture of experts: routing, the routed experts as grouped matrix products, shared experts.

One block serves Qwen3-MoE (softmax routing) and DeepSeek-V3 / Kimi K2 (sigmoid scores, a
correction bias used only to choose experts, group-limited choice, a routed scaling factor and
a shared expert). Parameter names follow transformers: `gate.weight [E, H]`,
`gate.e_score_correction_bias [E]`, `experts.gate_up_proj [E, 2I, H]`, `experts.down_proj
[E, H, I]`; checkpoints store one matrix per expert, stacked at load (`stack_expert_weights`).

The experts run without a Python loop over experts: a step's (token, expert) pairs are sorted
by expert and each projection is one grouped matrix product (`torch.nn.functional.grouped_mm`
or `torch._grouped_mm`: CPU in any float dtype, CUDA in bfloat16), with offsets computed on
the device, so nothing syncs with the host and the step stays graph-capturable. Where no
grouped product runs (e.g. CUDA float16/float32) each pair's expert matrices are gathered and
multiplied in one batched product instead, and the log says so once.
"""

from __future__ import annotations

import functools
import logging
import re

import torch
import torch.nn.functional as F
from torch import nn

from blockspec.config import MoEConfig
from blockspec.layers.mlp import SwiGLU
from blockspec.layers.packed_int import stack_n_major

log = logging.getLogger("blockspec.moe")

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_EXPERT_KEY = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_packed|weight_scale)$")
# A per-expert tensor's stacked names (gate and up concatenated along N, then down).
_STACKED = {"weight": ("gate_up_proj", "down_proj"), "weight_packed": ("gate_up_packed", "down_packed"),
            "weight_scale": ("gate_up_scale", "down_scale")}
# Bytes of gathered expert matrices per batched product on the fallback path.
_FALLBACK_CHUNK_BYTES = 1 << 28


def route(logits: torch.Tensor, cfg: MoEConfig, correction_bias: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits `[T, E]` (float32) → (weights `[T, k]` float32, expert ids `[T, k]`).

    softmax: top-k of the probabilities. sigmoid: scores plus the correction bias choose the
    experts (within the best `topk_groups` groups, a group scoring its two best experts); the
    weights are the uncorrected scores. Then optional renormalisation and the scaling factor.
    """
    if cfg.scoring == "softmax":
        scores = logits.softmax(dim=-1)
        weights, ids = scores.topk(cfg.top_k, dim=-1)
    else:
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias
        if cfg.num_groups > 1:
            T = choice.shape[0]
            grouped = choice.view(T, cfg.num_groups, -1)
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)                    # [T, G]
            best = group_scores.topk(cfg.topk_groups, dim=-1, sorted=False)[1]
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            choice = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(T, -1)
        ids = choice.topk(cfg.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        # DeepSeek guards the sum (sigmoid scores can all be tiny); softmax top-k sums are > 0.
        eps = 1e-20 if cfg.scoring == "sigmoid" else 0.0
        weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
    return weights * cfg.routed_scaling_factor, ids


class Router(nn.Module):
    """`gate.weight [E, H]` (and the sigmoid family's correction bias), kept in float32: the
    loader restores these in float32 whatever the serving dtype, as transformers does."""

    def __init__(self, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, hidden))
        if cfg.correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x `[T, H]` → (weights `[T, k]` float32, ids `[T, k]`)."""
        logits = F.linear(x.float(), self.weight.float())
        return route(logits, self.cfg, self.e_score_correction_bias)


@functools.lru_cache(maxsize=None)
def grouped_mm_works(device: torch.device, dtype: torch.dtype, hidden: int, intermediate: int) -> bool:
    """Whether a grouped product runs (and is right) here for these sizes: tried once, on a few
    rows, against per-group products; the answer is cached and logged when it is no."""
    if _GROUPED_MM is None:
        log.warning("this torch has no grouped matrix product: experts use gathered batched products")
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(6, hidden, generator=gen).to(device, dtype)
        w = torch.randn(3, intermediate, hidden, generator=gen).to(device, dtype)
        offs = torch.tensor([2, 2, 6], dtype=torch.int32, device=device)
        got = _GROUPED_MM(x, w.transpose(1, 2), offs=offs)
        want = torch.cat([x[:2] @ w[0].T, x[2:] @ w[2].T])
        ok = torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2 * hidden ** 0.5)
        error = "" if ok else "its result differs from per-expert products"
    except Exception as e:  # noqa: BLE001 - reported, and the fallback is used
        ok, error = False, f"{type(e).__name__}: {str(e)[:160]}"
    if not ok:
        log.warning("grouped matrix product unusable on %s %s (hidden %d, intermediate %d): %s; experts use "
                    "gathered batched products", device, dtype, hidden, intermediate, error)
    return ok


def gathered_mm(x: torch.Tensor, weight: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """`x[r] @ weight[expert_of_row[r]].T` for every row: x `[S, K]`, weight `[E, N, K]` → `[S, N]`.
    The grouped product's fallback: gathered matrices, batched, in chunks of bounded bytes."""
    S = x.shape[0]
    per_row = weight[0].numel() * weight.element_size()
    chunk = max(1, _FALLBACK_CHUNK_BYTES // max(per_row, 1))
    outs = [torch.bmm(weight[expert_of_row[s:s + chunk]], x[s:s + chunk, :, None])[..., 0]
            for s in range(0, S, chunk)]
    return torch.cat(outs) if outs else x.new_zeros(0, weight.shape[1])


class GroupedExperts(nn.Module):
    """The routed experts: `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`, SwiGLU."""

    def __init__(self, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.num_experts, self.intermediate = cfg.num_experts, cfg.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.intermediate_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(cfg.num_experts, hidden, cfg.intermediate_size))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x `[T, H]`, ids/weights `[T, k]` → Σ_k weights · expert_k(x) `[T, H]` (x's dtype)."""
        grouped = grouped_mm_works(x.device, x.dtype, x.shape[1], self.intermediate)
        return swiglu_experts(x, ids, weights, self.num_experts,
                              lambda rows, e, ends: expert_product(rows, self.gate_up_proj, e, ends, grouped),
                              lambda rows, e, ends: expert_product(rows, self.down_proj, e, ends, grouped))


def expert_product(rows: torch.Tensor, weight: torch.Tensor, sorted_ids: torch.Tensor, ends: torch.Tensor,
                   grouped: bool) -> torch.Tensor:
    """Rows `[S, K]` sorted by expert times their expert's `weight [E, N, K]` transposed → `[S, N]`:
    one grouped product over `ends [E]` (cumulative row counts), or gathered batched products."""
    if grouped:
        return _GROUPED_MM(rows, weight.transpose(1, 2), offs=ends)
    return gathered_mm(rows, weight, sorted_ids)


def swiglu_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, num_experts: int,
                   gate_up, down) -> torch.Tensor:
    """The routed experts' SwiGLU and combine, whatever stores the weights.

    x `[T, H]`, ids/weights `[T, k]` → Σ_k weights · down(silu(gate) · up) `[T, H]` (x's dtype).
    `gate_up` / `down` map (rows `[S, K]` sorted by expert, their expert ids `[S]`, `ends [E]` int32
    = cumulative rows per expert, on the device) → `[S, 2I]` (gate then up) / `[S, H]`."""
    T, k = ids.shape
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)                  # pairs grouped by expert
    rows = x[order // k]                               # [T·k, H]
    sorted_ids = flat[order]
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    ends = counts.cumsum(0, dtype=torch.int32)
    gate, up = gate_up(rows, sorted_ids, ends).chunk(2, dim=-1)
    out = down(F.silu(gate) * up, sorted_ids, ends)
    per_pair = torch.empty_like(out)
    per_pair[order] = out                              # back to (token, choice) order
    return (per_pair.view(T, k, -1).float() * weights[..., None]).sum(dim=1).to(x.dtype)


class MoE(nn.Module):
    """Router → routed experts, plus the shared experts (`shared_experts`, a SwiGLU of
    `num_shared_experts × intermediate` when the family has one)."""

    def __init__(self, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.gate = Router(hidden, cfg)
        self.experts = GroupedExperts(hidden, cfg)
        self.shared_experts = (SwiGLU(hidden, cfg.num_shared_experts * cfg.intermediate_size)
                               if cfg.num_shared_experts else None)
        # Which experts the last forward chose, `[E]` bool, when a benchmark asks (`record_expert_hits`).
        # A persistent buffer, written in place, so that CUDA-graph replays update it: a tensor
        # kept from inside a captured forward lives in the graph's pool and is overwritten.
        self.expert_hits: torch.Tensor | None = None

    def record_expert_hits(self) -> None:
        """From now on, each forward marks the experts it routed to in `expert_hits`."""
        self.expert_hits = torch.zeros(self.experts.num_experts, dtype=torch.bool, device=self.gate.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `[B, Q, H]` → `[B, Q, H]`."""
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        if self.expert_hits is not None:
            self.expert_hits.zero_()
            self.expert_hits.index_fill_(0, ids.reshape(-1), True)   # no host value: capturable
        out = self.experts(flat, ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(x.shape)


def stack_expert_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint keys `….experts.{e}.{gate,up,down}_proj.weight` → `….experts.gate_up_proj
    [E, 2I, H]` and `….experts.down_proj [E, H, I]`; INT4 kept packed (`.weight_packed`,
    `.weight_scale`) → `gate_up_packed`/`gate_up_scale` and `down_packed`/`down_scale` the same
    way (`layers/int4_experts.py`). The per-expert tensors are dropped as they are stacked. A
    missing expert is an error naming it; other keys pass through."""
    found: dict[tuple[str, str], dict[str, dict[int, str]]] = {}
    for key in state:
        m = _EXPERT_KEY.match(key)
        if m:
            found.setdefault((m[1], m[4]), {}).setdefault(m[3], {})[int(m[2])] = key
    for (prefix, tensor), parts in sorted(found.items()):
        n = max(len(keys) for keys in parts.values())
        for name in ("gate_proj", "up_proj", "down_proj"):
            missing = sorted(set(range(n)) - set(parts.get(name, {})))
            if missing:
                raise ValueError(f"checkpoint lacks {prefix}.{missing[0]}.{name}.{tensor} (experts 0…{n - 1})")

        def take(name):
            return [state.pop(parts[name][e]) for e in range(n)]
        gate_up, down = _STACKED[tensor]
        # Packed INT4 stacks N-major (the W4A16 kernel's layout) in the one copy.
        stack = torch.stack if tensor == "weight" else stack_n_major
        gate, up = take("gate_proj"), take("up_proj")
        state[f"{prefix}.{gate_up}"] = stack([torch.cat([g, u]) for g, u in zip(gate, up)])
        del gate, up
        state[f"{prefix}.{down}"] = stack(take("down_proj"))
    return state
