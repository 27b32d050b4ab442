"""Batch metadata for one attention step over the paged cache (see docs/design.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


MASK_KINDS = ("causal", "full", "tree")


@dataclass
class AttentionBatch:
    """A padded batch: row b has `prefix_lens[b]` cached tokens and `new_lens[b]` new ones.

    slots      [B, Q]    where each new token's K/V is written (padding → page 0)
    page_table [B, P]    pages of each row, padded with 0
    prefix_lens [B]      tokens already in the cache
    new_lens   [B]       valid new tokens (≤ Q)
    new_mask   [B, Q, Q] new token i sees new token j; None for the two masks a kernel derives
                         itself, `mask_kind` "causal" (prefill, chains) and "full" (a DFlash block)
    mask_kind  str       "tree" when new_mask is given explicitly (tree verification, tests)
    The new tokens occupy cache positions prefix_len … prefix_len + new_len − 1 in order.
    """

    slots: torch.Tensor
    page_table: torch.Tensor
    prefix_lens: torch.Tensor
    new_lens: torch.Tensor
    new_mask: torch.Tensor | None = None
    mask_kind: str = "tree"

    def __post_init__(self) -> None:
        if self.mask_kind not in MASK_KINDS:
            raise ValueError(f"mask_kind must be one of {', '.join(MASK_KINDS)}, got {self.mask_kind!r}")
        if self.mask_kind == "tree" and self.new_mask is None:
            raise ValueError("a tree mask needs new_mask")

    def mask_for(self, causal: bool = False) -> tuple[str, torch.Tensor | None]:
        """(mask kind, explicit new_mask or None), made causal among the new tokens when `causal`
        (a DFlash layer that attends causally inside its block)."""
        if not causal or self.mask_kind == "causal":
            return self.mask_kind, self.new_mask
        if self.mask_kind == "full":
            return "causal", None
        return "tree", self.new_mask.tril()

    def dense_new_mask(self, causal: bool = False) -> torch.Tensor:
        """`[B, Q, Q]` bool, materialised for backends that take an explicit mask."""
        kind, new_mask = self.mask_for(causal)
        B, Q = self.slots.shape
        if kind == "causal":
            return causal_new_mask(B, Q, self.slots.device)
        if kind == "full":
            return full_new_mask(B, Q, self.slots.device)
        return new_mask

    def without_spare_pages(self, page_size: int) -> "AttentionBatch":
        """This batch with the page table cut to the pages its tokens occupy (max prefix_len +
        Q), for a backend whose cost follows the table's width: a row may hold pages reserved for
        a later, wider step (the scheduler's reach), which no query here can see. Reads the
        lengths on the host: for host tensors (the CPU reference backend)."""
        needed = -(-(int(self.prefix_lens.max()) + self.slots.shape[1]) // page_size)
        if needed >= self.page_table.shape[1]:
            return self
        return replace(self, page_table=self.page_table[:, :max(needed, 1)])

    def visibility(self, page_size: int, sliding_window: int | None = None,
                   positions: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """Boolean mask `[B, 1, Q, P * page_size]`: query i may attend to gathered key j."""
        return visibility_mask(self.prefix_lens, self.new_lens, self.dense_new_mask(causal),
                               self.page_table.shape[1] * page_size, sliding_window, positions)


def visibility_mask(prefix_lens: torch.Tensor, new_lens: torch.Tensor, new_mask: torch.Tensor,
                    num_keys: int, sliding_window: int | None = None,
                    query_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Key j is visible to query i when j is cached (j < prefix) or is a new token the mask allows.

    With a sliding window, keys more than `window − 1` positions before the query are hidden
    (key positions of cached tokens are their indices; new tokens' come from query_positions).
    Padded query rows see key 0 only, so softmax never meets an all-masked row.
    """
    B, Q, _ = new_mask.shape
    device = new_mask.device
    j = torch.arange(num_keys, device=device)
    rel = j[None, :] - prefix_lens[:, None]                      # [B, K] index among new tokens
    is_cached = rel < 0
    is_new = (rel >= 0) & (rel < new_lens[:, None])
    rel_idx = rel.clamp(0, Q - 1)[:, None, :].expand(B, Q, num_keys)
    new_visible = new_mask.gather(2, rel_idx) & is_new[:, None, :]
    visible = is_cached[:, None, :] | new_visible
    if sliding_window is not None:
        if query_positions is None:
            raise ValueError("sliding window needs query positions")
        key_pos = torch.where(is_new, query_positions.gather(1, rel.clamp(0, Q - 1)), j[None, :])
        visible &= (query_positions[:, :, None] - key_pos[:, None, :]) < sliding_window
    query_valid = torch.arange(Q, device=device)[None, :] < new_lens[:, None]
    pad_row = (~query_valid)[:, :, None] & (j == 0)[None, None, :]
    visible = torch.where(query_valid[:, :, None], visible, pad_row)
    return visible[:, None]


def causal_new_mask(batch: int, q: int, device) -> torch.Tensor:
    """Prefill / chain verify: each new token sees the new tokens before it and itself."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril().expand(batch, q, q)


def full_new_mask(batch: int, q: int, device) -> torch.Tensor:
    """DFlash block drafting: the block attends to itself bidirectionally."""
    return torch.ones(batch, q, q, dtype=torch.bool, device=device)
