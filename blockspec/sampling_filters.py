"""The target-distribution filters (temperature -> top_k -> top_p -> min_p) without a full sort.

`filtered_probs_sortfree` is what `blockspec.sampling.filtered_probs` runs. `filtered_probs_sorted`
is the previous implementation (one stable descending sort of the whole vocabulary, float32
masses in sorted order), kept as a reference, and `filtered_probs_sorted_exact` evaluates the
sort-free definition below with a sort: it is the test oracle, bit-identical by construction.

The definition (rows are [B, *, V] logits; row b's settings broadcast over the middle dims)
----------------------------------------------------------------------------------------------
* s = float32(logits) / temperature, exactly as before; -0.0 counts as +0.0. Tokens are ordered
  by s descending, ties in vocabulary order (the order of a stable descending sort).
* w = float32 exp(s - max s) (so the most likely token has w = 1) and the integer weight
  W = floor(w * 2**S) with S = 62 - V.bit_length() (S = 44 for V = 151,936). Every sum of
  weights below is an exact int64 sum: it cannot overflow (V * 2**S < 2**62) and, being exact,
  does not depend on the summation order, the device or the algorithm.
* top_k (0, -1 or >= V = off): keep the first k tokens of the order.
* top_p (1 = off): among the top-k tokens, keep token j iff the weight of the top-k tokens
  strictly before j is < top_p * (weight of all top-k tokens), compared exactly (top_p is taken
  as the exact rational value of its float32; the bound is the integer T = ceil(top_p * Z) - 1).
  This is "mass strictly before the token < top_p" of the old code with the float32 cumsum
  replaced by exact arithmetic. The first token is always kept.
* min_p: keep token j iff w_j >= min_p. The renormalised probability ratio p_j / p_max of the
  old code equals w_j / w_max = w_j exactly in real arithmetic (the most likely token survives
  top_k and top_p, and renormalising does not change ratios), so this is the same rule without
  the float32 rounding of two softmaxes.
* The result is the float32 softmax of s over the kept tokens (zeros elsewhere); greedy rows
  are the one-hot of the first maximal s.

How it differs from `filtered_probs_sorted` (the decision of this module, and why)
--------------------------------------------------------------------------------
The old code decided top_p with a cumsum of float32 probabilities in sorted order and min_p
with float32 renormalised probabilities. Those decisions depend on rounding that a sort-free
algorithm cannot reproduce (it sums in another order), and at V ~ 150k that rounding is not
small: the float32 softmax normaliser loses addends that are tiny against its running sum
(measured on CPU at V = 151,936, T = 0.6: preceding masses up to 2e-5 too high, so tokens
truly below top_p were dropped), and the cumsum accumulates in float64 on CPU but in float32
on CUDA, so the old keep set was not even the same on both devices. So the definition was made
exact instead: the keep set is a function of the float32 s and w alone, any correct
implementation (this one, the sort-based oracle, another device) gives the same set bit for
bit, and the old function is the same rule up to its rounding:
  - top_k: identical (both are pure comparisons; no rounding involved);
  - top_p: the two can differ only for a token whose true preceding mass lies within the old
    code's float32 error of top_p (above), or within V * 2**-S (< 1e-8 of the largest weight)
    of it from the weight truncation;
  - min_p: only where w_j is within a few float32 ulps of min_p.
The probabilities on the kept set agree to float32 rounding (the final softmax sums in
vocabulary order instead of sorted order: a few ulps, under 1e-6 relative in the tests).

The algorithm
-------------
Both thresholds are found by selection over the order-preserving int32 key of s, never by
sorting: t = the smallest key with (weight or count of tokens with key > t) <= limit. Top_k
uses counts with limit k - 1, top_p integer weights with limit T. Tokens with key > t are kept;
tokens with key == t (ties) are kept in vocabulary order while the exclusive cumsum of their
count (top_k) or weight (top_p) allows. `method="radix"` selects with per-row histograms of
the key's digits (two 16-bit levels for V >= 2**15, fewer bits per level below, built with int64
scatter_add, which is exact and therefore deterministic), `method="bisect"` with 32 bisection
steps of masked sums; they give identical results. Every tensor has a shape fixed by the input
shape and every loop a fixed trip count: no .item(), no host synchronisation, no dependence
of the work on the sampling settings (greedy rows cost what T = 0.6 / top_p = 0.95 rows cost),
so the function can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover - import only for annotations (sampling imports this module)
    from blockspec.sampling import SamplingTensors

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_NO_LIMIT = 2**62  # more than any total weight (V * 2**S < 2**62): "top_p off"


def weight_scale_bits(vocab: int) -> int:
    """S of the definition: integer weights are floor(w * 2**S), and V * 2**S < 2**62."""
    return 62 - int(vocab).bit_length()


# ---------------------------------------------------------------------------------------------
# The previous, sort-based implementation (reference)


def _per_row(values: torch.Tensor, ndim: int) -> torch.Tensor:
    """Reshape a [B] tensor to [B, 1, ..., 1] so it broadcasts over a rank-`ndim` tensor."""
    return values.view(values.shape[0], *([1] * (ndim - 1)))


def _masked_softmax(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Softmax over the kept entries only (the others get probability 0)."""
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)


def filtered_probs_sorted(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The previous implementation, kept as a reference: logits [B, *, V] -> float32 [B, *, V].

    Filters apply in the order temperature -> top_k -> top_p -> min_p, each followed by a
    renormalisation (docs/verification.md); row b's settings broadcast over the middle dims. Greedy
    rows give the one-hot of the first maximal logit. Everything happens in one descending
    sort (stable, so ties keep vocabulary order), with masks built in sorted order. The top_p
    and min_p decisions use float32 masses, so they agree with the exact definition of this
    module only up to float32 rounding (see the module docstring).
    """
    ndim = logits.dim()
    temperature = _per_row(st.temperature, ndim)
    top_k = _per_row(st.top_k, ndim)
    top_p = _per_row(st.top_p, ndim)
    min_p = _per_row(st.min_p, ndim)
    greedy = _per_row(st.greedy, ndim)

    scaled = logits.float() / temperature
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(scaled.shape[-1], device=scaled.device)

    keep = (top_k <= 0) | (rank < top_k)
    probs = _masked_softmax(sorted_logits, keep)
    # Mass strictly before each token; top_p = 1 must keep everything even if rounding
    # makes the tail's preceding mass reach 1.
    mass_before = probs.cumsum(dim=-1) - probs
    keep = keep & ((top_p >= 1.0) | (mass_before < top_p))
    probs = _masked_softmax(sorted_logits, keep)
    keep = keep & (probs >= min_p * probs[..., :1])
    probs = _masked_softmax(sorted_logits, keep)

    filtered = torch.zeros_like(probs).scatter_(-1, order, probs)
    one_hot = torch.zeros_like(probs).scatter_(-1, scaled.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, filtered)


# ---------------------------------------------------------------------------------------------
# Pieces of the exact definition shared by the sort-free implementation and the sorted oracle


def _rows(values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Per-request values [B] -> per-row values [R, 1], R = prod(shape[:-1])."""
    lead = shape[:-1]
    return values.view(values.shape[0], *([1] * (len(lead) - 1))).expand(lead).reshape(-1, 1)


def _scaled_rows(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """s = float32(logits) / temperature as [R, V] (the same division as the old code)."""
    ndim = logits.dim()
    return (logits.float() / _per_row(st.temperature, ndim)).reshape(-1, logits.shape[-1])


def _order_key(s: torch.Tensor) -> torch.Tensor:
    """Order-preserving int32 key of float32 s: key(a) < key(b) iff a < b, key(-0.0) = key(0.0).

    Non-negative floats keep their bit pattern; a negative float with magnitude bits m maps to
    -m (its bit pattern is INT32_MIN + m, so -m = INT32_MIN - bits). Keys lie in (-2**31, 2**31).
    """
    bits = s.view(torch.int32)
    return torch.where(bits < 0, _INT32_MIN - bits, bits)


def _weights(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, W): float32 w = exp(s - max s) and int64 W = floor(w * 2**S), both [R, V]."""
    top = s.amax(dim=-1, keepdim=True)
    # A row without a finite logit would give NaN weights; make them 0 (its result is NaN anyway).
    w = torch.exp(s - torch.where(top == float("-inf"), 0.0, top))
    # w <= 1, so scaling by a power of two is exact in float32 and truncation is the floor.
    return w, (w * float(2 ** weight_scale_bits(s.shape[-1]))).long()


def _top_k_rows(top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """Effective k per row: 0 (off) and anything above V become V."""
    return torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)


def _top_p_limit(top_p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """T = the largest integer strictly below top_p * total, exactly; "no limit" for top_p >= 1.

    top_p: float32 [R, 1] in (0, 1]; total: int64 [R, 1] in [1, 2**62). With top_p = m * 2**-e
    (m < 2**24 an integer, read from the float's bits, denormals included), T is
    floor((m * total - 1) / 2**e), computed in two 31-bit limbs so that nothing overflows.
    """
    bits = top_p.contiguous().view(torch.int32).long()
    exponent = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    normal = exponent > 0
    mantissa = torch.where(normal, fraction | 0x800000, fraction)
    e = torch.where(normal, 150 - exponent, 149)
    # m * total - 1 = high * 2**31 + low, 0 <= low < 2**31.
    low = mantissa * (total & _INT32_MAX) - 1
    high = mantissa * (total >> 31) + (low >> 31)
    low = low & _INT32_MAX
    shift_down = (e - 31).clamp(0, 63)
    shift_up = (31 - e).clamp(0, 63)
    limit = torch.where(
        e >= 31,
        high >> shift_down,
        (high << shift_up) + (low >> e.clamp(0, 63)),
    )
    return torch.where(top_p >= 1.0, _NO_LIMIT, limit.clamp(min=0))  # total 0: no finite logit


def _finish(s: torch.Tensor, keep: torch.Tensor, greedy: torch.Tensor, shape) -> torch.Tensor:
    """Softmax of s over the kept tokens; greedy rows one-hot at the first maximum."""
    probs = _masked_softmax(s, keep)
    one_hot = torch.zeros_like(probs).scatter_(-1, s.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Selection: t = min{t : sum of values over tokens with key > t <= limit}


def _select_bisect(key: torch.Tensor, values: torch.Tensor | None, limit: torch.Tensor):
    """Selection by 32 bisection steps over the int32 key space; returns (t, mass above t).

    values None means a count of 1 per token. key int32 [R, V], values int64 [R, V],
    limit int64 [R, 1] >= 0; t and the mass are int64 [R, 1].
    """
    lo = torch.full_like(limit, _INT32_MIN)
    hi = torch.full_like(limit, _INT32_MAX)  # mass above INT32_MAX is 0 <= limit
    above_hi = torch.zeros_like(limit)
    for _ in range(32):  # the interval [lo, hi] has 2**32 keys: 32 halvings leave one
        mid = (lo + hi) >> 1
        above_mid = key > mid
        if values is None:
            above = above_mid.sum(dim=-1, keepdim=True)
        else:
            above = torch.where(above_mid, values, 0).sum(dim=-1, keepdim=True)
        ok = above <= limit
        hi = torch.where(ok, mid, hi)
        above_hi = torch.where(ok, above, above_hi)
        lo = torch.where(ok, lo, mid + 1)
    return hi, above_hi


class _RadixDigits:
    """The key's digits, most significant first, for histogram selection (computed once per call).

    With u = key + 2**31 in [0, 2**32) cut into digits of the given widths (summing to 32),
    `digits[l]` is digit l and `prefix[l]` the number formed by digits 0..l-1, which a token
    must share with the bucket selected so far to take part in level l.
    """

    def __init__(self, key: torch.Tensor, widths: tuple[int, ...]):
        self.widths = widths
        u = key.long() + 2**31
        self.digits, self.prefix = [], []
        shift = 32
        for level, width in enumerate(widths):
            shift -= width
            digit = u >> shift if shift else u
            self.digits.append(digit & ((1 << width) - 1) if level else digit)  # u < 2**32
            above = None if level == 0 else self.digits[0] if level == 1 else u >> (shift + width)
            self.prefix.append(above)

    def histogram(self, level: int, src: torch.Tensor) -> torch.Tensor:
        """Per-row sums of src by digit at `level`: int64 [R, 2**width] (exact integer adds)."""
        rows = self.digits[level].shape[0]
        hist = torch.zeros(rows, 1 << self.widths[level], dtype=torch.int64, device=src.device)
        return hist.scatter_add_(-1, self.digits[level], src)

    def select(self, values: torch.Tensor, first_histogram: torch.Tensor, limit: torch.Tensor):
        """Selection by histograms, level by level; returns (t as an int32 key value, mass above t).

        values: int64 [R, V] (for counts, an expanded 1); first_histogram: self.histogram(0, values).
        Invariant: the bucket chosen so far contains t, and `above` is the mass of the tokens
        above that bucket's key range (so `above` <= limit).
        """
        above = torch.zeros_like(limit)
        prefix = torch.zeros_like(limit)
        for level, width in enumerate(self.widths):
            if level == 0:
                hist = first_histogram
            else:
                inside = self.prefix[level] == prefix
                hist = self.histogram(level, torch.where(inside, values, 0))
            cumulative = hist.cumsum(dim=-1)
            # The mass above bucket b's key range is above + total - cumulative[b], which does
            # not increase with b; t lies in the first bucket where it is <= limit.
            rest = above + cumulative[:, -1:]
            bucket = (cumulative < rest - limit).sum(dim=-1, keepdim=True)
            bucket.clamp_(max=(1 << width) - 1)  # a no-op unless NaN/inf logits broke the sums
            above = rest - cumulative.gather(-1, bucket)
            prefix = (prefix << width) + bucket
        return prefix - 2**31, above


def _radix_widths(vocab: int) -> tuple[int, ...]:
    """Digit widths: about as many buckets per level as tokens, at most 2**16."""
    if vocab >= 2**15:
        return (16, 16)
    if vocab >= 2**9:
        return (11, 11, 10)
    return (8, 8, 8, 8)


# ---------------------------------------------------------------------------------------------
# The implementations of the exact definition


def _keep_mask_sortfree(s: torch.Tensor, top_k, top_p, min_p, method: str) -> torch.Tensor:
    """The kept tokens of [R, V] scaled logits, by selection; settings are [R, 1]."""
    vocab = s.shape[-1]
    key = _order_key(s)
    w, weight = _weights(s)
    k = _top_k_rows(top_k, vocab)
    if method == "auto":
        method = "radix"
    if method == "radix":
        digits = _RadixDigits(key, _radix_widths(vocab))
        ones = torch.ones(1, 1, dtype=torch.int64, device=s.device).expand_as(weight)
        count_hist, weight_hist = digits.histogram(0, ones), digits.histogram(0, weight)

        def select(values, first_histogram, limit):
            return digits.select(values, first_histogram, limit)

    elif method == "bisect":
        ones = count_hist = weight_hist = None

        def select(values, first_histogram, limit):
            return _select_bisect(key, values, limit)

    else:
        raise ValueError(f"unknown selection method {method!r}")

    # top_k: the k-th key; ties there kept in vocabulary order up to k tokens in all.
    t_k, n_above = select(ones, count_hist, k - 1)
    tie = key == t_k
    keep = (key > t_k) | (tie & (tie.cumsum(dim=-1, dtype=torch.int32) <= k - n_above))

    # top_p on the top-k tokens: the first token whose preceding weight exceeds T goes.
    limit = _top_p_limit(top_p, torch.where(keep, weight, 0).sum(dim=-1, keepdim=True))
    t_p, weight_above = select(weight, weight_hist, limit)
    tie = key == t_p
    tie_weight = torch.where(tie, weight, 0)
    tie_weight_before = tie_weight.cumsum(dim=-1) - tie_weight
    keep &= (key > t_p) | (tie & (tie_weight_before <= limit - weight_above))

    keep &= w >= min_p
    return keep


def filtered_probs_sortfree(
    logits: torch.Tensor, st: SamplingTensors, *, method: str = "auto"
) -> torch.Tensor:
    """The target distribution without sorting: logits [B, *, V] -> float32 probabilities.

    Implements the exact definition of the module docstring (same result as
    `filtered_probs_sorted_exact`, bit for bit); `method` is "radix" (histograms; "auto") or
    "bisect" (32 bisection steps), which agree exactly. Fixed shapes, no host synchronisation.
    """
    shape = logits.shape
    s = _scaled_rows(logits, st)
    keep = _keep_mask_sortfree(
        s, _rows(st.top_k, shape), _rows(st.top_p, shape), _rows(st.min_p, shape), method
    )
    return _finish(s, keep, _rows(st.greedy, shape), shape)


def unfiltered_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """`filtered_probs_sorted_exact` for rows without top_k, top_p or min_p: every token kept
    (their keep mask is all true there), so no sort."""
    s = _scaled_rows(logits, st)
    return _finish(s, torch.ones_like(s, dtype=torch.bool), _rows(st.greedy, logits.shape), logits.shape)


def filtered_probs_sorted_exact(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The exact definition evaluated the direct way, with a stable descending sort (the engine's
    on CUDA).

    Same s, w, W and final softmax as `filtered_probs_sortfree`; the keep decisions are made in
    sorted order with an exact int64 cumsum, so the two must agree bit for bit.
    """
    shape = logits.shape
    s = _scaled_rows(logits, st)
    w, weight = _weights(s)
    top_k, top_p, min_p = (_rows(x, shape) for x in (st.top_k, st.top_p, st.min_p))
    keep = _keep_sorted(s, weight, _top_k_rows(top_k, shape[-1]), top_p) & (w >= min_p)
    return _finish(s, keep, _rows(st.greedy, shape), shape)


def _keep_sorted(s: torch.Tensor, weight: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The top_k and top_p keep mask of [R, V] scaled logits by a stable descending sort of the
    whole row; k (effective) and top_p are [R, 1]."""
    order = torch.sort(s + 0.0, dim=-1, descending=True, stable=True).indices  # -0.0 == 0.0
    keep = torch.arange(s.shape[-1], device=s.device) < k
    sorted_weight = torch.where(keep, weight.gather(-1, order), 0)
    before = sorted_weight.cumsum(dim=-1) - sorted_weight
    keep &= before <= _top_p_limit(top_p, sorted_weight.sum(dim=-1, keepdim=True))
    return torch.zeros_like(keep).scatter_(-1, order, keep)


# Candidate counts `filtered_probs_prefix` tries before sorting a whole row: at T = 1, top_p 0.95
# the bundled target's nucleus held a median 278 and at most 1,752 of its 8,192 tokens.
PREFIX_SIZES = (256, 2048)


def filtered_probs_prefix(logits: torch.Tensor, st: SamplingTensors, sizes: tuple[int, ...] = PREFIX_SIZES) -> torch.Tensor:
    """The exact definition (bit for bit `filtered_probs_sorted_exact`), deciding each row from
    its n largest tokens where the top_k or top_p cut falls among them, n in `sizes`, and sorting
    the whole row only where it does not. On a CPU a full stable sort is most of a filtered
    step's sampling cost (58 ms of [128, 8192] on the 2-core CPU; the top 256 cost ≈ 5); rows
    that nothing cuts (top_k and top_p off) and greedy rows take no selection at all. Which rows
    need the next size is data: a host decision, so this is for the CPU, not a CUDA graph."""
    shape = logits.shape
    vocab = shape[-1]
    s = _scaled_rows(logits, st)
    w, weight = _weights(s)
    top_k, top_p, min_p = (_rows(x, shape) for x in (st.top_k, st.top_p, st.min_p))
    k = _top_k_rows(top_k, vocab)
    greedy = _rows(st.greedy, shape)
    cut = ((k < vocab) | (top_p < 1.0)) & ~greedy
    keep = ~cut.expand_as(s)                  # uncut rows keep every token (then min_p)
    rows = cut[:, 0].nonzero()[:, 0]
    key = _order_key(s)
    for n in sizes:
        if not len(rows) or n >= vocab:
            break
        decided, kept = _keep_from_prefix(key[rows], weight[rows], k[rows], top_p[rows], n)
        keep[rows[decided]] = kept[decided]
        rows = rows[~decided]
    if len(rows):
        keep[rows] = _keep_sorted(s[rows], weight[rows], k[rows], top_p[rows])
    return _finish(s, keep & (w >= min_p), greedy, shape)


def _keep_from_prefix(key: torch.Tensor, weight: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor,
                      n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(decided [R], keep [R, V]) from each row's n largest keys. Every token keyed above the
    n-th largest key is among them, and those tokens, in key order then vocabulary order, are
    exactly the start of the full stable order (ties at that key may be cut anywhere, so they are
    left out). A row is decided when its top_k ends inside that start, or (top_k off, so the
    top_p total is the whole row's) a token there is already past the top_p limit: the order's
    preceding weights only grow, so every later token goes too."""
    vocab = key.shape[-1]
    top, index = torch.topk(key, n, dim=-1)
    # Key descending, then vocabulary index ascending (the stable order): one int64 sort of n.
    order = torch.sort((top.long() << 32) - index, dim=-1, descending=True).indices
    index, top = index.gather(-1, order), top.gather(-1, order)
    sure = top > top[:, -1:]
    in_k = sure & (torch.arange(n, device=key.device) < k)
    sorted_weight = torch.where(in_k, weight.gather(-1, index), 0)
    before = sorted_weight.cumsum(dim=-1) - sorted_weight
    k_off = k >= vocab
    limit = _top_p_limit(top_p, torch.where(k_off, weight.sum(dim=-1, keepdim=True), sorted_weight.sum(dim=-1, keepdim=True)))
    past_limit = in_k & (before > limit)
    decided = (k <= sure.sum(dim=-1, keepdim=True)) | (k_off & past_limit.any(dim=-1, keepdim=True))
    keep = torch.zeros(key.shape, dtype=torch.bool, device=key.device).scatter_(-1, index, in_k & ~past_limit)
    return decided[:, 0], keep
