"""Tests of blockspec.sampling_filters: the sort-free filters against two references.

1. `oracle` below evaluates the exact definition of the module docstring independently: a stable
   sort, an int64 cumsum in sorted order, and Python Fractions for top_p * Z. The sort-free
   implementation (both selection methods) must equal it bit for bit, probabilities included.
2. `filtered_probs_sorted` (the previous float32 implementation) must agree up to its documented
   rounding: identical support except for tokens whose decision is within float32 error of
   its threshold, and the same probabilities to float32 rounding.
Negative controls show that the exact comparison catches an off-by-one at either boundary.
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import blockspec.sampling_filters as sf
from blockspec.sampling import SamplingParams, SamplingTensors, filtered_probs
from blockspec.sampling_filters import (
    filtered_probs_prefix,
    filtered_probs_sorted,
    filtered_probs_sorted_exact,
    filtered_probs_sortfree,
)

METHODS = ["radix", "bisect"]
# The exactness tests also run the CPU's prefix selection, with candidate counts small enough
# that rows reach every stage: decided from 4 tokens, from 64, or by the whole row's sort.
EXACT_METHODS = METHODS + ["prefix"]
# Distance to a threshold below which the float32 reference may legitimately decide otherwise.
# Its top_p masses are float32 probabilities whose float32 normaliser, summed over the whole
# vocabulary, comes out low by up to ~2e-5 relative at V = 151,936 on CPU (small addends lost
# against a large running sum), so its preceding masses run high by as much; min_p compares a
# ratio of two rounded float32 probabilities.
TOP_P_TOLERANCE = 1e-4
MIN_P_TOLERANCE = 1e-6


# ---------------------------------------------------------------------------------------------
# helpers


def tensors(params: list[SamplingParams]) -> SamplingTensors:
    return SamplingTensors.from_params(params, "cpu")


def float32(value: float) -> float:
    """The float32 value a setting becomes in SamplingTensors."""
    return float(torch.tensor(value, dtype=torch.float32))


def oracle(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, keep) of the exact definition, computed the direct way, one row at a time."""
    vocab = logits.shape[-1]
    st = tensors(params)
    s = (logits.float() / st.temperature.view(-1, *[1] * (logits.dim() - 1))).reshape(-1, vocab)
    w = torch.exp(s - s.amax(dim=-1, keepdim=True))
    weight = (w * 2.0 ** (62 - vocab.bit_length())).long()
    order = torch.sort(s + 0.0, dim=-1, descending=True, stable=True).indices
    rows_per_request = s.shape[0] // len(params)
    keep = torch.zeros_like(s, dtype=torch.bool)
    for row in range(s.shape[0]):
        p = params[row // rows_per_request]
        k = vocab if p.top_k <= 0 or p.top_k > vocab else p.top_k
        sorted_weight = weight[row, order[row, :k]]
        kept = k
        if p.top_p < 1:
            # Keep j iff (weight before j) < top_p * Z exactly, i.e. <= ceil(top_p * Z) - 1.
            bound = Fraction(float32(p.top_p)) * int(sorted_weight.sum())
            before = sorted_weight.cumsum(0) - sorted_weight
            kept = int((before <= math.ceil(bound) - 1).sum())
        keep[row, order[row, :kept]] = True
        keep[row] &= w[row] >= float32(p.min_p)
    probs = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
    greedy = torch.tensor([p.greedy for p in params]).repeat_interleave(rows_per_request)
    one_hot = torch.zeros_like(probs).scatter_(-1, s.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.where(greedy[:, None], one_hot, probs)
    return probs.reshape(logits.shape), keep.reshape(logits.shape)


def run(logits, st, method):
    if method == "prefix":
        return filtered_probs_prefix(logits, st, sizes=(4, 64))
    return filtered_probs_sortfree(logits, st, method=method)


def exact_mismatches(logits, params, method) -> int:
    """Number of probabilities that differ (bitwise) between the filter code and the oracle."""
    got = run(logits, tensors(params), method)
    expected, _ = oracle(logits, params)
    same = (got == expected) | (got.isnan() & expected.isnan())
    return int((~same).sum())


def random_params(num: int, vocab: int, generator: torch.Generator) -> list[SamplingParams]:
    """Per-request settings: greedy, temperatures 0.3-2, top_k 0/1/5/V, top_p 0.1-1, min_p 0-0.5."""

    def uniform(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=generator))

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=generator))]

    return [
        SamplingParams(
            temperature=pick([0.0, uniform(0.3, 2.0), uniform(0.3, 2.0), uniform(0.3, 2.0)]),
            top_k=pick([0, 1, 5, vocab, 0, 5]),
            top_p=pick([1.0, uniform(0.1, 1.0), uniform(0.1, 1.0), uniform(0.8, 1.0)]),
            min_p=pick([0.0, 0.0, uniform(0.0, 0.5), uniform(0.0, 0.05)]),
        )
        for _ in range(num)
    ]


def random_logits(shape, generator) -> torch.Tensor:
    """float32 logits, rows from flat (scale 0.5) to peaked (scale 6)."""
    scales = torch.tensor([0.5, 2.0, 6.0])[torch.randint(3, shape[:-1], generator=generator)]
    return torch.randn(*shape, generator=generator) * scales[..., None]


# (vocab, batch, positions): batch x positions rows, settings per batch row.
RANDOM_CASES = [(12, 48, 3), (1000, 32, 3), (50000, 8, 3)]


# ---------------------------------------------------------------------------------------------
# bit-for-bit equality with the exact definition


@pytest.mark.parametrize("method", EXACT_METHODS)
@pytest.mark.parametrize("vocab, batch, positions", RANDOM_CASES)
def test_random_rows_equal_the_exact_definition(vocab, batch, positions, method):
    generator = torch.Generator().manual_seed(vocab)
    for trial in range(2):
        params = random_params(batch, vocab, generator)
        logits = random_logits((batch, positions, vocab), generator)
        got = run(logits, tensors(params), method)
        expected, keep = oracle(logits, params)
        assert got.dtype == torch.float32 and got.shape == logits.shape
        assert torch.equal(got, expected)
        # The cases are not trivial: sampled rows lose tokens to each filter.
        sampled = torch.tensor([not p.greedy for p in params])[:, None].expand(batch, positions)
        kept = keep.sum(dim=-1)
        assert bool(((kept > 1) & (kept < vocab) & sampled).any())
    assert torch.equal(filtered_probs_sorted_exact(logits, tensors(params)), expected)


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_middle_dims_and_bfloat16_logits(method):
    generator = torch.Generator().manual_seed(5)
    params = random_params(6, 300, generator)
    logits = random_logits((6, 2, 3, 300), generator).bfloat16()  # many exact ties too
    got = run(logits, tensors(params), method)
    assert torch.equal(got, oracle(logits, params)[0])
    flat = run(logits[:, 1], tensors(params), method)
    assert torch.equal(got[:, 1], flat)  # a row's result does not depend on its neighbours


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_ties_straddling_the_top_k_boundary(method):
    generator = torch.Generator().manual_seed(1)
    vocab = 1000
    logits = torch.randint(0, 4, (6, vocab), generator=generator).float()  # ~250 tokens per value
    for top_k in [1, 5, 37, 251, 600, 999, vocab]:
        params = [SamplingParams(top_k=top_k, temperature=t) for t in (1.0, 0.5, 1.0, 2.0, 1.0, 0.7)]
        got = run(logits, tensors(params), method)
        assert torch.equal(got, oracle(logits, params)[0])
        assert ((got > 0).sum(dim=-1) == top_k).all()
        # The kept ties are the first ones in vocabulary order.
        for row in range(logits.shape[0]):
            kept = (got[row] > 0).nonzero().flatten()
            boundary = logits[row, kept].min()
            ties = (logits[row] == boundary).nonzero().flatten()
            kept_ties = ties[(got[row, ties] > 0)]
            assert torch.equal(kept_ties, ties[: len(kept_ties)])
        # top_k has no rounding at all: the float32 reference agrees exactly on the support.
        assert torch.equal(got > 0, filtered_probs_sorted(logits, tensors(params)) > 0)


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_ties_straddling_the_top_p_boundary(method):
    """Equal logits: the preceding mass of the j-th tied token is j/n exactly (integer weights)."""
    for vocab in [4, 1000, 1024]:
        logits = torch.zeros(1, vocab)
        for top_p in [0.25, 0.5, 0.7, 0.999, 1e-6]:
            for value in [top_p, float(torch.nextafter(torch.tensor(float32(top_p)), torch.tensor(1.0)))]:
                params = [SamplingParams(top_p=value)]
                got = run(logits, tensors(params), method)
                assert torch.equal(got, oracle(logits, params)[0])
                # kept j iff j / vocab < top_p: ceil(top_p * vocab) tokens, the first ones.
                expected = math.ceil(Fraction(float32(value)) * vocab)
                assert (got[0] > 0).tolist() == [j < expected for j in range(vocab)]
        if vocab in (4, 1024):  # dyadic masses: the float32 reference is exact here as well
            for top_p in [0.25, 0.5, 0.75]:
                st = tensors([SamplingParams(top_p=top_p)])
                assert torch.equal(filtered_probs_sortfree(logits, st) > 0, filtered_probs_sorted(logits, st) > 0)


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_tie_groups_at_both_boundaries(method):
    # Ten tied maxima, then two other groups. top_k 7 keeps the first seven maxima; top_p 0.5
    # of those keeps j with j/7 < 0.5, i.e. the first four.
    logits = torch.full((1, 40), -1.0)
    maxima = torch.tensor([3, 5, 6, 11, 17, 18, 20, 25, 31, 39])
    logits[0, maxima] = 2.0
    logits[0, ::4] = torch.where(logits[0, ::4] == 2.0, 2.0, 0.5)
    cases = [
        (SamplingParams(top_k=7, top_p=0.5), maxima[:4]),
        (SamplingParams(top_k=7), maxima[:7]),
        (SamplingParams(top_k=12, top_p=0.999), None),
        (SamplingParams(top_p=0.9, min_p=0.3), None),
        (SamplingParams(temperature=0.1, top_p=0.35), maxima[:4]),  # others negligible: j/10 < 0.35
    ]
    for params, expected_kept in cases:
        got = run(logits, tensors([params]), method)
        assert torch.equal(got, oracle(logits, [params])[0])
        if expected_kept is not None:
            assert torch.equal((got[0] > 0).nonzero().flatten(), expected_kept)


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_negative_and_positive_zero_are_one_tie(method):
    logits = torch.tensor([[-1.0, -0.0, 0.0, -0.0, -2.0, 0.0]])
    for top_k in [1, 2, 3, 4]:
        params = [SamplingParams(top_k=top_k)]
        got = run(logits, tensors(params), method)
        assert torch.equal(got, oracle(logits, params)[0])
        assert torch.equal(got > 0, filtered_probs_sorted(logits, tensors(params)) > 0)
        assert (got[0] > 0).nonzero().flatten().tolist() == [1, 2, 3, 5][:top_k]


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_rows_of_minus_infinity(method):
    generator = torch.Generator().manual_seed(3)
    vocab = 500
    logits = random_logits((5, vocab), generator)
    logits[0, 10:] = float("-inf")  # ten finite tokens, top_k asks for more
    logits[1, torch.randperm(vocab, generator=generator)[:480]] = float("-inf")
    logits[2, :] = float("-inf")
    logits[2, 77] = 4.0  # a single finite token
    logits[3:] = float("-inf")  # nothing finite at all
    for params in [
        [SamplingParams(top_k=50)] * 5,
        [SamplingParams(temperature=0.7, top_p=0.9, min_p=0.01)] * 5,
        [SamplingParams(temperature=0.0), SamplingParams(top_p=0.3), SamplingParams(), SamplingParams(),
         SamplingParams(temperature=0.0)],
    ]:
        st = tensors(params)
        got = run(logits, st, method)
        assert mismatch_free(got, oracle(logits, params)[0])
        reference = filtered_probs_sorted(logits, st)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-7, equal_nan=True)
        assert torch.equal(got[2], torch.nn.functional.one_hot(torch.tensor(77), vocab).float())
        assert got[0, 10:].eq(0).all() and got[1][logits[1] == float("-inf")].eq(0).all()
        # No finite logit: NaN like the reference for sampled rows, token 0 for greedy ones.
        if params[4].greedy:
            assert got[4].tolist() == [1.0] + [0.0] * (vocab - 1)
        assert got[3].isnan().all()


def mismatch_free(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool(((got == expected) | (got.isnan() & expected.isnan())).all())


# ---------------------------------------------------------------------------------------------
# agreement with the previous float32 implementation


def threshold_distances(logits, params, tokens) -> list[tuple[float, float]]:
    """For each (row, token): (preceding mass - top_p, w - min_p), in float64 from the float32 w.

    The preceding mass is that of the top-k tokens before the token in sorted order, as a
    fraction of the top-k mass (inf for a token outside the top k).
    """
    vocab = logits.shape[-1]
    st = tensors(params)
    s = (logits.float() / st.temperature.view(-1, *[1] * (logits.dim() - 1))).reshape(-1, vocab)
    w = torch.exp(s - s.amax(dim=-1, keepdim=True)).double()
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rows_per_request = s.shape[0] // len(params)
    distances = []
    for row, token in tokens:
        p = params[row // rows_per_request]
        k = vocab if p.top_k <= 0 or p.top_k > vocab else p.top_k
        sorted_w = w[row, order[row, :k]]
        position = int((order[row] == token).nonzero())
        before = float(sorted_w[:position].sum()) / float(sorted_w.sum()) if position < k else math.inf
        distances.append((before - float32(p.top_p), float(w[row, token]) - float32(p.min_p)))
    return distances


def near_threshold(logits, params, disagree) -> list[bool]:
    """For each disagreeing token: is its top_p or min_p decision within float32 error?"""
    tokens = disagree.reshape(-1, logits.shape[-1]).nonzero().tolist()
    return [
        abs(top_p) <= TOP_P_TOLERANCE or abs(min_p) <= MIN_P_TOLERANCE
        for top_p, min_p in threshold_distances(logits, params, tokens)
    ]


@pytest.mark.parametrize("vocab, batch, positions", RANDOM_CASES)
def test_random_rows_match_the_float32_sorted_reference(vocab, batch, positions):
    generator = torch.Generator().manual_seed(100 + vocab)
    rows = disagreeing_rows = 0
    for trial in range(3):
        params = random_params(batch, vocab, generator)
        logits = random_logits((batch, positions, vocab), generator)
        got = filtered_probs_sortfree(logits, tensors(params))
        reference = filtered_probs_sorted(logits, tensors(params))
        disagree = (got > 0) != (reference > 0)
        assert all(near_threshold(logits, params, disagree))
        same_support = ~disagree.any(dim=-1)
        torch.testing.assert_close(got[same_support], reference[same_support], rtol=1e-5, atol=1e-7)
        rows += same_support.numel()
        disagreeing_rows += int((~same_support).sum())
    assert disagreeing_rows <= rows // 20


def test_full_vocabulary_disagreements_are_float32_errors_of_the_reference():
    """At V = 151,936 the float32 reference drops tokens whose true preceding mass is below
    top_p (its normaliser is too small); the exact definition keeps them, as float64 says."""
    vocab, rows = 151_936, 17
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 3.0
    params = [SamplingParams(temperature=0.6, top_p=0.95)] * rows
    got = filtered_probs_sortfree(logits, tensors(params))
    reference = filtered_probs_sorted(logits, tensors(params))
    assert torch.equal(got, oracle(logits, params)[0])
    disagree = ((got > 0) != (reference > 0)).nonzero().tolist()
    assert len(disagree) <= 8  # a few rows at most, one boundary token each (2 with torch 2.13)
    for (row, token), (top_p_distance, _) in zip(disagree, threshold_distances(logits, params, disagree)):
        assert abs(top_p_distance) <= TOP_P_TOLERANCE
        assert bool(got[row, token] > 0) == (top_p_distance < 0)  # float64 agrees with the new rule


def test_prefix_rows_reach_every_stage(monkeypatch):
    """With candidate counts 4 and 64 at V = 1000, rows are decided at each stage, and the ones
    left sort whole; greedy rows and rows that no filter cuts take no selection."""
    stages = []
    real_prefix, real_sorted = sf._keep_from_prefix, sf._keep_sorted

    def prefix(key, weight, k, top_p, n):
        decided, keep = real_prefix(key, weight, k, top_p, n)
        stages.append((n, len(key), int(decided.sum())))
        return decided, keep

    def whole(s, weight, k, top_p):
        stages.append(("sort", len(s), len(s)))
        return real_sorted(s, weight, k, top_p)

    monkeypatch.setattr(sf, "_keep_from_prefix", prefix)
    monkeypatch.setattr(sf, "_keep_sorted", whole)
    generator = torch.Generator().manual_seed(21)
    params = random_params(32, 1000, generator) + [SamplingParams(temperature=0.0, top_p=0.5), SamplingParams(min_p=0.1)]
    logits = random_logits((34, 2, 1000), generator)
    got = filtered_probs_prefix(logits, tensors(params), sizes=(4, 64))
    assert torch.equal(got, oracle(logits, params)[0])
    (n1, rows1, decided1), (n2, rows2, decided2), (last, rows3, _) = stages
    assert (n1, n2, last) == (4, 64, "sort")
    assert 0 < decided1 < rows1 and rows2 == rows1 - decided1 and 0 < decided2 < rows2 and rows3 == rows2 - decided2
    cut = [not p.greedy and (0 < p.top_k < 1000 or p.top_p < 1) for p in params]
    assert rows1 == 2 * sum(cut)


def test_filtered_probs_is_the_sortfree_implementation():
    generator = torch.Generator().manual_seed(9)
    params = random_params(16, 700, generator)
    logits = random_logits((16, 2, 700), generator)
    assert torch.equal(filtered_probs(logits, tensors(params)), filtered_probs_sortfree(logits, tensors(params)))


# ---------------------------------------------------------------------------------------------
# pieces


def test_top_p_limit_is_the_largest_integer_below_top_p_times_total():
    generator = torch.Generator().manual_seed(4)
    top_ps = torch.rand(300, generator=generator)
    top_ps = torch.cat([top_ps, torch.tensor([1e-6, 0.1, 0.5, 0.95, 1.0 - 2**-24, 1e-40, 2**-126, 0.3])])
    totals = torch.randint(1, 2**62, (top_ps.numel(),), generator=generator)
    totals[:40] = torch.randint(1, 1000, (40,), generator=generator)
    totals[40:50] = 2**62 - 1
    top_ps[50:60] = 0.5  # products that are exact integers
    totals[50:60] = 2 * torch.randint(1, 2**61, (10,), generator=generator)
    limits = sf._top_p_limit(top_ps[:, None], totals[:, None])[:, 0]
    for top_p, total, limit in zip(top_ps.tolist(), totals.tolist(), limits.tolist()):
        assert limit == math.ceil(Fraction(top_p) * total) - 1
    assert sf._top_p_limit(torch.ones(1, 1), torch.tensor([[123]])).item() >= 2**62  # top_p 1: off


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("vocab", [11, 3000, 40000])
def test_runs_on_meta_tensors(vocab, method):
    """Meta tensors have no data: any .item(), bool(), nonzero or boolean indexing raises."""
    st = tensors([SamplingParams(temperature=0), SamplingParams(top_k=3, top_p=0.5, min_p=0.1)])
    st_meta = SamplingTensors(**{name: v.to("meta") if torch.is_tensor(v) else v for name, v in vars(st).items()})
    probs = filtered_probs_sortfree(torch.empty(2, 3, vocab, device="meta"), st_meta, method=method)
    assert probs.shape == (2, 3, vocab) and probs.dtype == torch.float32


SYNC_TOKENS = (".item(", ".tolist(", "nonzero", "masked_select", ".cpu(", ".numpy(", "argwhere", "bool(")


def test_no_sync_calls_in_source():
    functions = [
        sf.filtered_probs_sortfree, sf._keep_mask_sortfree, sf._select_bisect, sf._RadixDigits,
        sf._radix_widths, sf._top_p_limit, sf._weights, sf._order_key, sf._finish, sf._rows,
        sf._scaled_rows, sf._top_k_rows, sf._masked_softmax, sf._per_row,
    ]
    for function in functions:
        source = inspect.getsource(function)
        assert not [token for token in SYNC_TOKENS if token in source], function.__name__


class OpLog(TorchDispatchMode):
    """Records every aten op with its output shapes."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])
                  if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), shapes))
        return out


@pytest.mark.parametrize("method", METHODS)
def test_the_work_does_not_depend_on_settings_or_data(method):
    """Greedy rows and T=0.6 / top_p=0.95 rows run exactly the same ops on the same shapes."""
    generator = torch.Generator().manual_seed(8)
    logs = []
    for params, scale in [
        (SamplingParams(temperature=0.0), 1.0),
        (SamplingParams(temperature=0.6, top_p=0.95), 3.0),
        (SamplingParams(temperature=1.3, top_k=40, top_p=0.5, min_p=0.2), 0.0),
    ]:
        logits = torch.randn(17, 5000, generator=generator) * scale
        with OpLog() as log:
            filtered_probs_sortfree(logits, tensors([params] * 17), method=method)
        logs.append(log.ops)
    assert logs[0] == logs[1] == logs[2]
    assert not [op for op, _ in logs[0] if "sort" in op or "topk" in op]


# ---------------------------------------------------------------------------------------------
# negative controls: the exact comparison catches an off-by-one at either boundary


def wrong_top_p_limit(top_p, total):
    """Keeps a token whose preceding mass equals top_p * Z ("<=" instead of "<")."""
    return torch.where(top_p >= 1.0, sf._NO_LIMIT, right_top_p_limit(top_p, total) + 1)


def wrong_top_k_rows(top_k, vocab):
    """Keeps one token too many at the top_k boundary."""
    k = right_top_k_rows(top_k, vocab)
    return torch.where(k < vocab, k + 1, k)


right_top_p_limit = sf._top_p_limit
right_top_k_rows = sf._top_k_rows


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_negative_control_off_by_one_at_the_top_p_boundary(method, monkeypatch):
    tie_case = (torch.zeros(1, 1000), [SamplingParams(top_p=0.25)])  # the 251st has mass 0.25
    generator = torch.Generator().manual_seed(12)
    random_case = (random_logits((8, 3, 1000), generator), random_params(8, 1000, generator))
    assert exact_mismatches(*tie_case, method) == 0
    monkeypatch.setattr(sf, "_top_p_limit", wrong_top_p_limit)
    assert exact_mismatches(*tie_case, method) > 0
    # On random logits a preceding mass is never exactly top_p * Z: the ties are what catch it.
    assert exact_mismatches(*random_case, method) == 0


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_negative_control_off_by_one_at_the_top_k_boundary(method, monkeypatch):
    generator = torch.Generator().manual_seed(13)
    ties = torch.randint(0, 4, (4, 1000), generator=generator).float()
    random_case = (random_logits((8, 3, 1000), generator), random_params(8, 1000, generator))
    tie_case = (ties, [SamplingParams(top_k=k) for k in (1, 5, 251, 600)])
    assert exact_mismatches(*tie_case, method) == 0 and exact_mismatches(*random_case, method) == 0
    monkeypatch.setattr(sf, "_top_k_rows", wrong_top_k_rows)
    assert exact_mismatches(*tie_case, method) > 0
    assert exact_mismatches(*random_case, method) > 0


def test_a_batch_without_filters_skips_the_sort_and_gives_the_same_bits(monkeypatch):
    """`SamplingTensors.filters` False (known on the host: no row sets top_k, top_p or min_p):
    `filtered_probs` takes `unfiltered_probs`, equal bit for bit to the sorted path, greedy rows,
    ties and -inf logits included; a batch with any filter still sorts."""
    import blockspec.sampling as sampling_module
    from blockspec.sampling import SamplingParams, SamplingTensors, filtered_probs
    from blockspec.sampling_filters import filtered_probs_sorted_exact
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, 50, generator=gen)
    logits[0, 0, :5] = 2.0                          # ties
    logits[1, 1, 10:20] = float("-inf")
    plain = [SamplingParams(temperature=t) for t in (0.7, 1.0, 1.3)] + [SamplingParams(temperature=0.0)]
    st = SamplingTensors.from_params(plain, "cpu")
    assert st.filters is False
    sorts = []
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **k: sorts.append(1) or real_sort(*a, **k))
    got = filtered_probs(logits, st)
    assert sorts == []
    assert torch.equal(got, filtered_probs_sorted_exact(logits, st))
    filtered = SamplingTensors.from_params(plain[:3] + [SamplingParams(temperature=0.9, top_p=0.9)], "cpu")
    assert filtered.filters is True
    filtered_probs(logits, filtered)
    assert sorts                                    # the sorted path
    assert sampling_module.any_filters([SamplingParams(min_p=0.1)]) and sampling_module.any_filters([SamplingParams(top_k=5)])
