"""The per-position logits seam: transforms of the target's logits at every verify position,
applied before the sampling filters and verification (docs/logits_processing.md).

A verify step scores a tree: node 0 is the root (the last committed token) and node i's logits
give the distribution of the token that follows node i. The history that precedes *that*
position is the request's committed tokens (prompt + output, root included) followed by the
draft tokens on the path from the root to node i (i included, root excluded). A processor maps
logits `[B, W, V]` to logits `[B, W, V]` knowing that history (`VerifyPositions`); verification
then samples exactly the processed target distribution, for chains and trees alike. Plain
decoding is a verify of the root alone (W = 1) and the first token after a prefill is the same
with the prompt as history, so one seam serves every sampled position.

Processors are host objects the engine owns (`Engine.logits_processors`); per step only those
some scheduled request asks for run (`active_processors`), on every row of the batch (fixed
shapes): a processor must leave a row that does not ask for it unchanged. The step's
processors are known on the host, so a batch that has any runs eagerly, never in a CUDA graph
captured without them (`engine/cuda_graphs.py`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Protocol

import torch

from blockspec.speculative.tree import DraftTree, chain_tree, tree_attention_mask


class VerifyPositions:
    """The history of every verify position of a step, row b = `seqs[b]`, node i of `tree`.

    seqs: the scheduled sequences (host side: `tokens`, `num_prompt`, `params`, `request_id`).
    tree: the step's draft tree on the device (`tokens`, `parents [B, W]`); root-only for plain
        decoding and for the sample after a prefill.
    Derived tensors are built on first use and shared by every processor of the step.
    """

    def __init__(self, seqs, tree: DraftTree):
        self.seqs = list(seqs)
        self.tree = tree
        self._path_counts: dict[int, torch.Tensor] = {}

    @property
    def device(self) -> torch.device:
        return self.tree.tokens.device

    @cached_property
    def path_mask(self) -> torch.Tensor:
        """`[B, W, W]` bool: node j's token precedes node i's position (j is i or an ancestor of
        i, j not the root, i not padding)."""
        return path_mask(self.tree.parents)

    def path_counts(self, vocab: int) -> torch.Tensor:
        """`[B, W, V]` int32: how often each token occurs among the draft tokens before each
        position (the cumulative one-hot along the path to the node)."""
        if vocab not in self._path_counts:
            self._path_counts[vocab] = path_token_counts(self.tree.tokens, self.path_mask, vocab)
        return self._path_counts[vocab]


class LogitsProcessor(Protocol):
    """A per-position transform of the target's logits (see the module docstring)."""

    def wants(self, params) -> bool:
        """Host side: whether a request with these SamplingParams needs this processor."""
        ...

    def __call__(self, logits: torch.Tensor, positions: VerifyPositions) -> torch.Tensor:
        """logits `[B, W, V]` (any float dtype) -> processed logits `[B, W, V]`; rows whose
        request does not want the processor come back unchanged."""
        ...


def active_processors(processors, seqs) -> tuple:
    """The processors that at least one of `seqs` wants, in order."""
    return tuple(p for p in processors if any(p.wants(s.params) for s in seqs))


def process_logits(logits: torch.Tensor, processors, positions: VerifyPositions) -> torch.Tensor:
    """Apply `processors` in order to logits `[B, W, V]`; no processor: the logits unchanged."""
    for processor in processors:
        logits = processor(logits, positions)
    return logits


def path_mask(parents: torch.Tensor) -> torch.Tensor:
    """`[B, W, W]` bool from parents `[B, W]`: [b, i, j] iff j ≥ 1 is i or an ancestor of i and i
    is a real node or the root (padding positions see no draft tokens; their logits are unused)."""
    reach = tree_attention_mask(parents)
    not_root = torch.arange(parents.shape[1], device=parents.device) >= 1
    is_node = (parents >= 0) | (parents == -1)
    return reach & not_root[None, None, :] & is_node[:, :, None]


def path_token_counts(tokens: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[B, W, V]` int32: counts[b, i, v] = #{j : mask[b, i, j] and tokens[b, j] = v}.

    tokens `[B, W]` int64 < vocab, mask `[B, W, W]` bool (`path_mask`). One scatter-add of the
    mask into the token columns: no loop over positions, and no [B, W, W, V] one-hot.
    """
    B, W = tokens.shape
    counts = torch.zeros(B, W, vocab, dtype=torch.int32, device=tokens.device)
    index = tokens[:, None, :].expand(B, W, W)
    return counts.scatter_add_(2, index, mask.to(torch.int32))


def token_counts(rows: list[list[int]], vocab: int, device) -> torch.Tensor:
    """`[B, V]` int32 counts of the token ids in each host list, in one host→device copy (rows
    padded with the out-of-vocabulary id V, which lands in a dropped column)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.tensor([r + [vocab] * (width - len(r)) for r in rows], dtype=torch.int64).reshape(len(rows), width)
    ids = ids.to(device)
    counts = torch.zeros(len(rows), vocab + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab]


def root_only_tree(roots: torch.Tensor) -> DraftTree:
    """The tree of a step that scores only each row's last token (`roots [B]`): node 0, no drafts."""
    return chain_tree(torch.zeros(roots.shape[0], 0, dtype=torch.long, device=roots.device), roots)
