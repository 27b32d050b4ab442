"""Sampling parameters, the target-distribution filters, and inverse-CDF sampling.

`filtered_probs` is the single definition of "the distribution a request samples from": plain
decoding samples from it and the speculative verifier checks drafts against it. Every random
choice is an inverse-CDF draw from a float64 uniform that the host drew beforehand (the engine's
generator; seeded requests take the exponential race instead, `seeded_sampling`), so the
device-side functions here are pure, free of host synchronisation and safe to capture in a CUDA
graph.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

from blockspec.structured_output import StructuredOutput
from blockspec.sampling_filters import filtered_probs_prefix, filtered_probs_sorted_exact, unfiltered_probs


def _is_real(value: object) -> bool:
    """True for int/float-like numbers, False for bools (which Python treats as ints)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    """True for integers, False for bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Per-request sampling settings, validated on construction.

    temperature 0 means greedy; top_k 0 or -1 and top_p 1 and min_p 0 switch a filter off.
    After validation `stop` and `stop_token_ids` are lists (possibly empty) and top_k -1 is 0.

    presence_penalty, frequency_penalty (OpenAI, -2..2), repetition_penalty (vLLM's, > 0, 1 = off)
    and logit_bias ({token id: bias in -100..100}) change the target's logits before the filters
    (`blockspec/penalties.py`, docs/logits_processing.md). logprobs: None = off, k = report the
    log-probability of each generated token and its k most likely alternatives (0..20).

    kept_special_token_ids: special (control) tokens decoded into the output text although the
    others are skipped; the server sets it to a tool-call format's markers (Kimi's
    `<|tool_call_begin|>`…), which its parser must read. After validation a sorted tuple.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    structured_output: StructuredOutput | None = None  # the grammar the output must match
    kept_special_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1 = off), got {self.top_k!r}")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
            setattr(self, name, float(value))
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {r!r}")
        self.repetition_penalty = float(r)
        self.logit_bias = _normalised_logit_bias(self.logit_bias)
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise ValueError(f"structured_output must be a StructuredOutput or None, got {self.structured_output!r}")
        kept = self.kept_special_token_ids
        if not isinstance(kept, (list, tuple, frozenset, set)) or not all(_is_int(i) and i >= 0 for i in kept):
            raise ValueError(f"kept_special_token_ids must be a collection of token ids (ints >= 0), got {kept!r}")
        self.kept_special_token_ids = tuple(sorted(int(i) for i in kept))
        self.stop = _normalised_stop(self.stop)
        self.stop_token_ids = _normalised_stop_token_ids(self.stop_token_ids)
        # Store plain Python numbers so the values are hashable/JSON-able whatever came in.
        self.temperature = float(t)
        self.top_p = float(self.top_p)
        self.min_p = float(self.min_p)
        self.top_k = 0 if self.top_k == -1 else int(self.top_k)
        self.max_tokens = int(self.max_tokens)
        self.seed = None if self.seed is None else int(self.seed)

    @property
    def greedy(self) -> bool:
        """Temperature 0: always take the most likely token."""
        return self.temperature == 0.0

    @property
    def changes_logits(self) -> bool:
        """Some penalty or bias is set: the target's logits are processed before the filters."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> "SamplingParams":
        """Build from a mapping (e.g. a request body); unknown keys raise ValueError."""
        if not isinstance(values, Mapping):
            raise ValueError(f"sampling parameters must be a mapping, got {type(values).__name__}")
        _raise_on_unknown_fields(values.keys())
        return cls(**values)


MAX_LOGPROBS = 20  # alternatives per token, OpenAI's chat limit
MAX_LOGIT_BIAS = 100.0


def _normalised_logit_bias(bias: object) -> dict[int, float] | None:
    """`logit_bias` as {int token id >= 0: float in [-100, 100]}, None when empty. Whether the
    ids are in the vocabulary is the engine's check (it knows the vocabulary)."""
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}")
    out = {}
    for token, value in bias.items():
        if not _is_int(token) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {token!r}")
        if not _is_real(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {token}")
        out[int(token)] = float(value)
    return out or None


def _normalised_stop(stop: object) -> list[str]:
    """`stop` as a list of strings; raises ValueError for anything else."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise ValueError(f"stop must be a str or a list of str, got {stop!r}")


def _normalised_stop_token_ids(ids: object) -> list[int]:
    """`stop_token_ids` as a list of ints; raises ValueError for anything else."""
    if ids is None:
        return []
    if isinstance(ids, (list, tuple)) and all(_is_int(i) for i in ids):
        return [int(i) for i in ids]
    raise ValueError(f"stop_token_ids must be a list of int, got {ids!r}")


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))


def _raise_on_unknown_fields(names) -> None:
    """ValueError naming every key that is not a SamplingParams field."""
    unknown = sorted(str(n) for n in names if n not in _FIELD_NAMES)
    if unknown:
        raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")


def _with_unknown_field_check(dataclass_init):
    """Wrap the generated __init__ so an unknown keyword is a ValueError, not a TypeError."""

    @functools.wraps(dataclass_init)
    def checked_init(self, *args, **kwargs):
        _raise_on_unknown_fields(kwargs.keys())
        dataclass_init(self, *args, **kwargs)

    return checked_init


SamplingParams.__init__ = _with_unknown_field_check(SamplingParams.__init__)


@dataclass
class SamplingTensors:
    """The batch's sampling settings as per-row device tensors (all shaped [B]).

    Greedy rows carry temperature 1.0 so that dividing by it is harmless; `greedy` selects
    the one-hot argmax for them.
    """

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float32
    min_p: torch.Tensor  # float32
    greedy: torch.Tensor  # bool
    # Known on the host: whether any row sets top_k, top_p or min_p (True when not known, e.g.
    # inside a CUDA graph, whose replays take whatever settings the buffers hold).
    filters: bool = True

    @classmethod
    def from_params(cls, params: list[SamplingParams], device) -> "SamplingTensors":
        """Stack per-request settings into row tensors on `device`."""

        def column(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=column([1.0 if p.greedy else p.temperature for p in params], torch.float32),
            top_k=column([p.top_k for p in params], torch.int64),
            top_p=column([p.top_p for p in params], torch.float32),
            min_p=column([p.min_p for p in params], torch.float32),
            greedy=column([p.greedy for p in params], torch.bool),
            filters=any_filters(params),
        )


def any_filters(params: list[SamplingParams]) -> bool:
    """Whether any request's top_k, top_p or min_p removes tokens."""
    return any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params)


# What a decode batch's verification computes, known on the host (one CUDA graph each):
# "greedy" every row at temperature 0 (the argmax walk), "sampled" some row samples and no row
# filters (a softmax), "filtered" some row's top_k / top_p / min_p removes tokens (a sort per
# position: 0.24 ms of a 0.57 ms step at 16 rows on the H100 when it ran for every sampled batch).
SAMPLING_VARIANTS = ("greedy", "sampled", "filtered")


def sampling_variant(params: list[SamplingParams]) -> str:
    """The batch's entry of SAMPLING_VARIANTS."""
    all_greedy = all(p.greedy for p in params)
    return variant_of(all_greedy, not all_greedy and any_filters(params))


def variant_of(all_greedy: bool, filters: bool) -> str:
    """The entry of SAMPLING_VARIANTS of a batch known by its host-side flags (`StepInputs`)."""
    return "greedy" if all_greedy else "filtered" if filters else "sampled"


def filtered_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The target distribution: logits [B, *, V] -> float32 probabilities [B, *, V].

    Filters apply in the order temperature -> top_k -> top_p -> min_p, each followed by a
    renormalisation (docs/verification.md); row b's settings broadcast over the middle dims. Greedy
    rows give the one-hot of the first maximal logit; ties are ordered by vocabulary index (the
    order of a stable descending sort). The top_p and min_p decisions are exact, on integer
    weights: see `blockspec.sampling_filters` for the precise definition. It is computed with one
    sort per row: on an H200 that beat the sort-free histogram search of the same rule at 1, 17
    and 272 rows of a 151,936-word vocabulary (bench/results/gpu_fastpath/sampling_filters.json);
    the sort-free version stays as `filtered_probs_sortfree`, equal bit for bit. A batch known
    to set no filter (`st.filters` False) skips the sort: every token is kept, the same
    softmax (on the 2-core CPU the sort was 38 ms of a 110 ms step at 64 rows, T = 1). On a CPU
    a row is decided from its largest tokens where its cut falls among them
    (`filtered_probs_prefix`, equal bit for bit; 4× faster than the sort at T = 0.6, top_p
    0.95, 16 positions of 8 rows): its data-dependent row selection has no place in a CUDA graph.
    """
    if not st.filters:
        return unfiltered_probs(logits, st)
    if logits.device.type == "cpu":
        return filtered_probs_prefix(logits, st)
    return filtered_probs_sorted_exact(logits, st)


def tempered_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The drafter's law for a sampled tree's children: logits [B, *, V] at each row's
    temperature (greedy rows one-hot), with top_k, top_p and min_p NOT applied.

    Recursive rejection sampling is exact for any q the drafts were drawn from, so the
    truncation filters need not reach q, and for trees they should not: a sibling is a draw
    without replacement, so a node can have no more children than q has tokens, and a drafter's
    nucleus of one or two tokens left a 64-node tree thin and deep (docs/verification.md has
    the figures). Chains keep the filtered q, which accepts more there."""
    return unfiltered_probs(logits, st)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [*, V] (need not be normalised), uniforms [*] -> tokens [*] int64.

    Picks the first index whose float64 cumulative probability exceeds u * total, total being
    the last cumulative value. Zero-probability tokens are never picked (u = 0 gives the first
    positive token); the result is also capped at the last positive token as a guard against
    u * total rounding up to total. Pass uniforms already on the probs' device: a host-to-device
    copy here would not be capturable in a CUDA graph.
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[..., -1:]
    threshold = uniforms.to(device=cdf.device, dtype=torch.float64).unsqueeze(-1) * total
    first_above = (cdf <= threshold).sum(dim=-1)
    last_positive = (cdf < total).sum(dim=-1)
    return torch.minimum(first_above, last_positive)
