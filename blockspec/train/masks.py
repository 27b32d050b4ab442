"""Where DFlash training blocks sit and what each of their tokens may see (docs/dflash.md, Training).

One training sequence of length T carries N blocks of B tokens. Block n starts at anchor
a_n: its tokens are [token a_n, MASK × (B−1)] at positions a_n … a_n+B−1, and its position
k (1 ≤ k < B) is trained to predict token a_n+k. Keys are laid out as
[context of all T positions ‖ all N·B block tokens], so one dense attention serves every
block at once; the mask below makes the blocks independent of one another.

All functions accept anchors with leading batch dimensions `[..., N]`.
"""

from __future__ import annotations

import torch


def block_query_owner(num_blocks: int, block_size: int, device=None) -> torch.Tensor:
    """Index of the block each of the N·B block tokens belongs to: `[N·B]`."""
    return torch.arange(num_blocks * block_size, device=device) // block_size


def training_attention_mask(anchors: torch.Tensor, block_size: int, seq_len: int) -> torch.Tensor:
    """Boolean visibility `[..., N·B, T + N·B]` (True = may attend).

    Block token q of block n sees context key j < T iff j < a_n (strictly before its anchor:
    the anchor token itself enters as the block's first token, not as context), and block key
    T + m iff m is in block n (bidirectional inside the block, nothing of other blocks).
    """
    num_blocks = anchors.shape[-1]
    owner = block_query_owner(num_blocks, block_size, anchors.device)          # [Q]
    query_anchor = anchors[..., owner]                                        # [..., Q]
    context = torch.arange(seq_len, device=anchors.device) < query_anchor[..., None]
    own_block = owner[:, None] == owner[None, :]                              # [Q, Q]
    own_block = own_block.expand(*context.shape[:-1], own_block.shape[-1])
    return torch.cat([context, own_block], dim=-1)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """RoPE positions of the block tokens: a_n + k for k = 0…B−1, flattened `[..., N·B]`."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[..., None] + offsets).flatten(-2)


def block_input_ids(anchor_tokens: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """Block token ids [anchor token, MASK × (B−1)] per block, flattened `[..., N·B]`."""
    blocks = torch.full((*anchor_tokens.shape, block_size), mask_token_id,
                        dtype=anchor_tokens.dtype, device=anchor_tokens.device)
    blocks[..., 0] = anchor_tokens
    return blocks.flatten(-2)


def block_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                  block_size: int, anchor_valid: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block token, the id it must predict and whether it is trained: `[B_seq, N·B]` each.

    input_ids, loss_mask `[B_seq, T]`; anchors `[B_seq, N]`. Position k of block n predicts
    token a_n + k; it is trained when k ≥ 1, that token exists, and every token a_n+1 … a_n+k
    is inside the response (loss_mask), i.e. the block has not run past the anchor's response
    into a user turn or padding. `anchor_valid [B_seq, N]` switches off padding blocks.
    """
    seq_len = input_ids.shape[-1]
    target_pos = block_positions(anchors, block_size)                         # [Bs, Q]
    exists = target_pos < seq_len
    clamped = target_pos.clamp(max=seq_len - 1)
    targets = input_ids.gather(-1, clamped)
    in_response = loss_mask.gather(-1, clamped).bool() & exists
    in_response = in_response.unflatten(-1, (anchors.shape[-1], block_size))
    in_response[..., 0] = True  # the anchor itself is given, not predicted
    # A block stays trainable only up to the first position that leaves the response.
    trained = in_response.long().cumprod(-1).bool()
    trained[..., 0] = False
    if anchor_valid is not None:
        trained &= anchor_valid[..., None]
    return targets, trained.flatten(-2)


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions that may start a block: response tokens followed by a response token.

    The anchor is given (at inference it is the last committed token), so the first token of
    a response is never an anchor's target, and a response's last token (its end-of-turn)
    starts no block: generation stops there. Blocks near the end of a sequence or response
    are kept; their positions past it are simply not trained (see `block_targets`), so the
    drafter also learns how replies end.
    """
    mask = loss_mask.bool()
    candidates = torch.zeros_like(mask)
    candidates[..., :-1] = mask[..., :-1] & mask[..., 1:]
    return candidates


def sample_anchors(loss_mask: torch.Tensor, max_anchors: int, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `max_anchors` distinct random anchors per sequence, sorted: `[B_seq, N]` and validity.

    loss_mask `[B_seq, T]` (on CPU with the generator). N = min(max_anchors, the largest
    number of candidates in the batch); sequences with fewer candidates get padding anchors
    at position 0 marked invalid.
    """
    candidates = anchor_candidates(loss_mask.cpu())
    counts = candidates.sum(-1)
    num = int(min(max_anchors, int(counts.max()) if counts.numel() else 0))
    num = max(num, 1)
    # Random keys on candidates, +inf elsewhere; the N smallest are a uniform sample.
    keys = torch.rand(candidates.shape, generator=generator, dtype=torch.float64)
    keys = keys.masked_fill(~candidates, float("inf"))
    picked = keys.topk(num, dim=-1, largest=False).indices
    valid = torch.arange(num)[None, :] < counts.clamp(max=num)[:, None]
    anchors = torch.where(valid, picked, torch.zeros_like(picked))
    anchors, order = anchors.masked_fill(~valid, torch.iinfo(torch.long).max).sort(-1)
    valid = valid.gather(-1, order)
    anchors = anchors.masked_fill(~valid, 0)
    return anchors, valid
