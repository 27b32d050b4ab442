"""Log-probabilities of committed tokens, from the target's raw logits at the position that
produced each token (docs/logits_processing.md).

Raw, as vLLM reports them by default: log_softmax of the target's logits before logit_bias,
penalties, any other logits processor, temperature and the top-k / top-p / min-p filters. They
are the target's, never the drafter's: on a speculative step the committed token at depth d was
drawn at verify node path[d] (the root for d = 0), whose target logits the verify forward gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PathLogprobs:
    """Per row b and committed depth d (padding where nothing was committed).

    chosen     [B, D+1]    float32  log p(committed[b, d])
    top_ids    [B, D+1, k] int64    the k most likely tokens, most likely first (torch.topk's order of ties)
    top_values [B, D+1, k] float32  their log-probabilities, non-increasing
    """

    chosen: torch.Tensor
    top_ids: torch.Tensor
    top_values: torch.Tensor


def path_logprobs(logits: torch.Tensor, path: torch.Tensor, committed: torch.Tensor, k: int) -> PathLogprobs:
    """logits `[B, W, V]` (raw, one row per verify node), path / committed `[B, D+1]` int64 (−1
    padded, as `VerifyResult` has them), k ≥ 0 alternatives per token."""
    rows = torch.log_softmax(logits.gather(1, path.clamp(min=0)[:, :, None].expand(-1, -1, logits.shape[-1]))
                             .float(), dim=-1)                                                    # [B, D+1, V]
    chosen = rows.gather(-1, committed.clamp(min=0)[:, :, None]).squeeze(-1)
    top_values, top_ids = torch.topk(rows, k, dim=-1, sorted=True)
    return PathLogprobs(chosen, top_ids, top_values)


@dataclass
class TokenLogprob:
    """One generated token's log-probability and its `k` most likely alternatives (most likely first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def pack_logprobs(lp: PathLogprobs) -> torch.Tensor:
    """`[B, (D+1)(1 + 2k)]` float64 (ids are exact in it): the device side of one host copy."""
    return torch.cat([t.reshape(t.shape[0], -1).double() for t in (lp.chosen, lp.top_ids, lp.top_values)], dim=1)


def unpack_logprobs(row: list[float], tokens: list[int], width: int, k: int) -> list[TokenLogprob]:
    """One row of `pack_logprobs(...).tolist()` (D+1 = `width`) -> a TokenLogprob per committed
    token of `tokens` (depth order)."""
    ids, values = row[width:width + width * k], row[width + width * k:]
    return [TokenLogprob(t, row[d], [(int(i), v) for i, v in zip(ids[d * k:(d + 1) * k], values[d * k:(d + 1) * k])])
            for d, t in enumerate(tokens)]
