"""Prompt-lookup drafting: hand-built cases and a brute-force reference on random sequences."""

from __future__ import annotations

import time

import torch

from blockspec.speculative.ngram import propose_ngram, propose_ngram_batch


def reference_ngram(tokens, num_draft, max_ngram=3, min_ngram=1):
    """Direct scan: for each n, the latest earlier start i < len − n whose n tokens equal the suffix."""
    tokens = list(tokens)
    for n in range(max_ngram, max(min_ngram, 1) - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + num_draft]
    return []


def test_longer_match_preferred():
    tokens = [1, 2, 3, 10, 11, 9, 2, 3, 20, 21, 1, 2, 3]
    assert propose_ngram(tokens, 2) == [10, 11]                  # [1, 2, 3] at 0
    assert propose_ngram(tokens, 2, max_ngram=2) == [20, 21]     # [2, 3] most recently at 6


def test_most_recent_occurrence():
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]
    assert propose_ngram(tokens, 2, max_ngram=2) == [2, 5]
    assert propose_ngram(tokens, 1, max_ngram=2) == [2]


def test_truncated_at_end_and_overlap():
    assert propose_ngram([7, 8, 9, 7, 8], 5) == [9, 7, 8]
    assert propose_ngram([4, 4, 4, 4], 3) == [4]                 # match overlaps the suffix


def test_no_match_and_short_inputs():
    assert propose_ngram([1, 2, 3, 4], 3) == []
    assert propose_ngram([], 3) == [] and propose_ngram([9], 3) == []
    assert propose_ngram([1, 2, 1], 0) == []
    assert propose_ngram([1, 2, 3, 2], 3, max_ngram=3, min_ngram=2) == []   # only a 1-gram matches
    assert propose_ngram([1, 2, 3, 2], 3, max_ngram=3, min_ngram=1) == [3, 2]


def test_byte_matches_across_token_boundaries_are_ignored():
    # In the int64 byte encoding, [256, 0, 0] contains the bytes of [1, 0] at a non-token
    # offset; only the genuine 1-gram match of [0] (at index 2) may be used.
    tokens = [256, 0, 0, 99, 1, 0]
    assert propose_ngram(tokens, 3, max_ngram=2) == [99, 1, 0]


def test_matches_reference_on_random_sequences():
    gen = torch.Generator().manual_seed(0)
    for trial in range(400):
        vocab = int(torch.randint(2, 6, (1,), generator=gen))
        length = int(torch.randint(0, 40, (1,), generator=gen))
        tokens = torch.randint(0, vocab, (length,), generator=gen)
        if trial % 2:
            tokens = tokens * 256                            # byte patterns that straddle tokens
        tokens = tokens.tolist()
        num_draft = int(torch.randint(1, 6, (1,), generator=gen))
        max_ngram = int(torch.randint(1, 5, (1,), generator=gen))
        min_ngram = int(torch.randint(1, max_ngram + 1, (1,), generator=gen))
        assert propose_ngram(tokens, num_draft, max_ngram, min_ngram) == \
            reference_ngram(tokens, num_draft, max_ngram, min_ngram), (tokens, num_draft, max_ngram)


def test_batch_helper_pads_with_zero():
    seqs = [[7, 8, 9, 7, 8], [1, 2, 3, 4], [3, 5, 3]]
    tokens, counts = propose_ngram_batch(seqs, 4)
    assert tokens.dtype == counts.dtype == torch.int64
    assert tokens.tolist() == [[9, 7, 8, 0], [0, 0, 0, 0], [5, 3, 0, 0]]
    assert counts.tolist() == [3, 0, 2]
    empty_tokens, empty_counts = propose_ngram_batch([], 4)
    assert empty_tokens.shape == (0, 4) and empty_counts.shape == (0,)


def test_timing_print_long_sequence():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50000, (4000,), generator=gen).tolist()   # almost surely no match
    runs = 50
    start = time.perf_counter()
    for _ in range(runs):
        propose_ngram(tokens, 8)
    elapsed_us = (time.perf_counter() - start) / runs * 1e6
    print(f"\npropose_ngram 4000 tokens, no 2/3-gram match: {elapsed_us:.0f} us")
