"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the latest earlier
occurrence of the sequence's own suffix. Runs on the host every step, so the search is done
by `bytes.rfind` (C speed) over a fixed-width encoding of the tokens.
"""

from __future__ import annotations

from array import array
from typing import Sequence

import torch

_TOKEN_CODE = "q"                      # int64 per token: any token id fits
_TOKEN_BYTES = array(_TOKEN_CODE).itemsize


def propose_ngram(tokens: Sequence[int], num_draft: int, max_ngram: int = 3,
                  min_ngram: int = 1) -> list[int]:
    """Up to `num_draft` tokens that followed the most recent earlier match of the last n tokens.

    n goes from max_ngram down to min_ngram; the first n with a match wins. A match must end
    before the last token (so at least one token follows it; it may overlap the suffix).
    Returns [] when no n matches.
    """
    length = len(tokens)
    min_ngram = max(min_ngram, 1)
    if num_draft <= 0 or length < min_ngram + 1:
        return []
    encoded = array(_TOKEN_CODE, tokens).tobytes()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        start = _rfind_tokens(encoded, encoded[(length - n) * _TOKEN_BYTES:], length - 1)
        if start >= 0:
            return list(tokens[start + n:start + n + num_draft])
    return []


def _rfind_tokens(encoded: bytes, pattern: bytes, end_token: int) -> int:
    """Token index of the last occurrence of `pattern` lying wholly in tokens [0, end_token).

    `bytes.rfind` can also hit byte offsets that straddle token boundaries; those are
    skipped by searching again strictly to their left.
    """
    end = end_token * _TOKEN_BYTES
    while True:
        found = encoded.rfind(pattern, 0, end)
        if found < 0:
            return -1
        if found % _TOKEN_BYTES == 0:
            return found // _TOKEN_BYTES
        end = found + len(pattern) - 1


def propose_ngram_batch(seqs: list[Sequence[int]], num_draft: int, max_ngram: int = 3,
                        min_ngram: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """`propose_ngram` for each sequence: (drafts [B, num_draft] int64 padded with 0, counts [B]).

    Both tensors are built on the host in one go; the caller moves them to the device.
    """
    width = max(num_draft, 0)
    drafts = [propose_ngram(seq, num_draft, max_ngram, min_ngram) for seq in seqs]
    padded = [draft + [0] * (width - len(draft)) for draft in drafts]
    tokens = torch.tensor(padded, dtype=torch.int64).reshape(len(seqs), width)
    counts = torch.tensor([len(draft) for draft in drafts], dtype=torch.int64)
    return tokens, counts
