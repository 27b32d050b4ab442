"""Tests of blockspec.sampling: parameter validation, the filters, inverse-CDF sampling, seeds."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from blockspec.sampling import (
    SamplingParams,
    SamplingTensors,
    filtered_probs,
    sample_from_probs,
)

ALPHA = 1e-3
NUM_DRAWS = 20_000
from stats_helpers import chi_square_pvalue


# ---------------------------------------------------------------------------------------------
# helpers


def tensors_for(*params: SamplingParams, device="cpu") -> SamplingTensors:
    """SamplingTensors for a list of requests."""
    return SamplingTensors.from_params(list(params), device)


def reference_filter(
    logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[list[float], float]:
    """Per-row filter written the obvious way, in float64 Python.

    Returns the probabilities and the smallest distance of any keep/drop decision to its
    threshold, so a caller can skip rows where float32 rounding could legitimately flip one.
    """
    vocab = len(logits)
    if temperature == 0:
        best = max(range(vocab), key=lambda i: (logits[i], -i))  # first maximal index
        return [1.0 if i == best else 0.0 for i in range(vocab)], math.inf

    def renormalised(values):
        total = sum(values)
        return [v / total for v in values]

    scaled = [x / temperature for x in logits]
    top = max(scaled)
    probs = renormalised([math.exp(x - top) for x in scaled])
    order = sorted(range(vocab), key=lambda i: -scaled[i])  # stable: ties keep vocab order
    margin = math.inf

    if 0 < top_k < vocab:
        margin = min(margin, scaled[order[top_k - 1]] - scaled[order[top_k]])
        for i in order[top_k:]:
            probs[i] = 0.0
        probs = renormalised(probs)

    if top_p < 1:
        mass_before = 0.0
        for i in order:
            if probs[i] == 0.0:
                continue
            margin = min(margin, abs(mass_before - top_p))
            keep = mass_before < top_p
            mass_before += probs[i]
            if not keep:
                probs[i] = 0.0
        probs = renormalised(probs)

    if min_p > 0:
        threshold = min_p * max(probs)
        for i in range(vocab):
            if probs[i] > 0.0:
                margin = min(margin, abs(probs[i] - threshold))
                if probs[i] < threshold:
                    probs[i] = 0.0
        probs = renormalised(probs)
    return probs, margin


# ---------------------------------------------------------------------------------------------
# SamplingParams


def test_defaults():
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, 0, 0.0)
    assert params.max_tokens == 16 and params.seed is None and params.ignore_eos is False
    assert params.stop == [] and params.stop_token_ids == []
    assert not params.greedy


BAD_VALUES = [
    ("temperature", -0.1),
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", "1.0"),
    ("temperature", None),
    ("top_p", 0.0),
    ("top_p", -0.5),
    ("top_p", 1.01),
    ("top_p", float("nan")),
    ("top_k", -2),
    ("top_k", 2.5),
    ("top_k", "5"),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("min_p", float("nan")),
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 4.0),
    ("seed", 1.5),
    ("seed", "7"),
    ("stop", 5),
    ("stop", ["ok", 3]),
    ("stop", [b"bytes"]),
    ("stop_token_ids", 3),
    ("stop_token_ids", [1, "2"]),
    ("stop_token_ids", [1.0]),
    ("ignore_eos", "yes"),
    ("kept_special_token_ids", 5),
    ("kept_special_token_ids", [1, -2]),
    ("kept_special_token_ids", ["<|tool_call_begin|>"]),
]


@pytest.mark.parametrize("field,value", BAD_VALUES)
def test_bad_value_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


def test_unknown_field_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="foo"):
        SamplingParams(foo=1)
    with pytest.raises(ValueError, match="frequency_bias"):
        SamplingParams(temperature=0.5, frequency_bias=2)
    with pytest.raises(ValueError, match="foo"):
        SamplingParams.from_dict({"temperature": 0.0, "foo": 1})


def test_edge_values_accepted_and_normalised():
    greedy = SamplingParams(temperature=0)
    assert greedy.greedy and isinstance(greedy.temperature, float)
    assert SamplingParams(top_p=1.0).top_p == 1.0
    assert SamplingParams(top_p=1e-6).top_p == 1e-6
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(top_k=0).top_k == 0
    assert SamplingParams(min_p=0.0).min_p == 0.0
    assert SamplingParams(min_p=1.0).min_p == 1.0
    assert SamplingParams(max_tokens=1).max_tokens == 1
    assert SamplingParams(seed=0).seed == 0
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=["a", "b"]).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=[2, 7]).stop_token_ids == [2, 7]
    assert SamplingParams(kept_special_token_ids=[9, 3]).kept_special_token_ids == (3, 9)
    params = SamplingParams.from_dict({"temperature": 0.7, "top_k": -1, "stop": "x", "seed": 3})
    assert (params.temperature, params.top_k, params.stop, params.seed) == (0.7, 0, ["x"], 3)


# ---------------------------------------------------------------------------------------------
# SamplingTensors and filtered_probs


def test_sampling_tensors_rows():
    st = tensors_for(
        SamplingParams(temperature=0.5, top_k=7, top_p=0.9, min_p=0.1),
        SamplingParams(temperature=0.0, top_k=-1),
    )
    assert st.temperature.dtype == torch.float32 and st.top_k.dtype == torch.int64
    assert st.top_p.dtype == torch.float32 and st.min_p.dtype == torch.float32
    assert st.greedy.dtype == torch.bool
    assert st.temperature.tolist() == [0.5, 1.0]  # greedy row: 1.0, never a division by 0
    assert st.top_k.tolist() == [7, 0]
    assert st.greedy.tolist() == [False, True]
    assert st.top_p[0].item() == pytest.approx(0.9) and st.min_p[0].item() == pytest.approx(0.1)


def random_row_settings(num_rows: int, generator: torch.Generator) -> list[SamplingParams]:
    """A mix of per-row settings that switches every filter on and off, greedy rows included."""
    temperatures = [0.0, 0.3, 0.7, 1.0, 1.6]
    top_ks = [0, 1, 3, 10, 50]
    top_ps = [1.0, 0.95, 0.6, 0.3]
    min_ps = [0.0, 0.02, 0.2]

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=generator))]

    return [
        SamplingParams(
            temperature=pick(temperatures), top_k=pick(top_ks), top_p=pick(top_ps), min_p=pick(min_ps)
        )
        for _ in range(num_rows)
    ]


@pytest.mark.parametrize("middle_dims", [(), (3,)])
def test_filtered_probs_matches_reference(middle_dims):
    generator = torch.Generator().manual_seed(1234)
    num_rows, vocab = 48, 30
    params = random_row_settings(num_rows, generator)
    logits = torch.randn(num_rows, *middle_dims, vocab, generator=generator) * 2.0
    probs = filtered_probs(logits, tensors_for(*params))

    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    flat_logits = logits.reshape(num_rows, -1, vocab)
    flat_probs = probs.reshape(num_rows, -1, vocab)
    compared = skipped = truncated = 0
    for b, p in enumerate(params):
        for m in range(flat_logits.shape[1]):
            expected, margin = reference_filter(
                flat_logits[b, m].tolist(), p.temperature, p.top_k, p.top_p, p.min_p
            )
            if margin < 1e-4:  # float32 rounding may flip a decision this close to a threshold
                skipped += 1
                continue
            compared += 1
            truncated += sum(1 for e in expected if e == 0.0) > 0
            torch.testing.assert_close(
                flat_probs[b, m], torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-4
            )
    assert skipped <= compared // 10
    assert truncated >= compared // 2  # the filters really removed tokens in most cases


def test_top_p_keeps_tokens_whose_preceding_mass_is_below_top_p():
    uniform = torch.zeros(1, 4)  # four tied tokens of probability exactly 0.25
    for top_p, expected in [
        (0.25, [1.0, 0.0, 0.0, 0.0]),  # second token's preceding mass 0.25 is not < 0.25
        (0.5, [0.5, 0.5, 0.0, 0.0]),
        (0.5001, [1 / 3, 1 / 3, 1 / 3, 0.0]),
        (1.0, [0.25] * 4),
    ]:
        probs = filtered_probs(uniform, tensors_for(SamplingParams(top_p=top_p)))
        torch.testing.assert_close(probs[0], torch.tensor(expected), rtol=0, atol=1e-7)

    # Preceding masses are 0, 0.4, 0.75: top_p 0.7 keeps two tokens although 0.4 + 0.35 > 0.7.
    logits = torch.tensor([[0.35, 0.25, 0.4]]).log()
    probs = filtered_probs(logits, tensors_for(SamplingParams(top_p=0.7)))
    torch.testing.assert_close(probs[0], torch.tensor([0.35 / 0.75, 0.0, 0.4 / 0.75]))
    # The most likely token survives any top_p.
    probs = filtered_probs(logits, tensors_for(SamplingParams(top_p=1e-6)))
    torch.testing.assert_close(probs[0], torch.tensor([0.0, 0.0, 1.0]))


def test_min_p_threshold_is_inclusive():
    # Tokens tied with the maximum have p == 1.0 * max p exactly: min_p = 1 keeps all of them.
    logits = torch.tensor([[2.0, 0.0, 2.0, 1.0]])
    probs = filtered_probs(logits, tensors_for(SamplingParams(min_p=1.0)))
    torch.testing.assert_close(probs[0], torch.tensor([0.5, 0.0, 0.5, 0.0]), rtol=0, atol=0)
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    probs = filtered_probs(logits, tensors_for(SamplingParams(min_p=0.5)))  # threshold 0.25
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0]))


def test_filter_order_top_k_then_top_p_then_min_p():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top_k 2 -> [4/7, 3/7]; then top_p 0.5 drops the second (preceding mass 4/7 >= 0.5).
    # The other order (top_p first) would keep two tokens.
    probs = filtered_probs(logits, tensors_for(SamplingParams(top_k=2, top_p=0.5)))
    torch.testing.assert_close(probs[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # top_p 0.75 keeps three (preceding 0.7 < 0.75); min_p 0.3 then keeps all three.
    # min_p first would drop 0.1 and renormalise, after which top_p keeps only two.
    probs = filtered_probs(logits, tensors_for(SamplingParams(top_p=0.75, min_p=0.3)))
    torch.testing.assert_close(probs[0], torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]))


def test_greedy_rows_are_one_hot_of_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 1.0, 2.0, 5.0]])
    st = tensors_for(SamplingParams(temperature=0, top_k=1, top_p=0.1), SamplingParams())
    probs = filtered_probs(logits, st)
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], dim=-1))


# ---------------------------------------------------------------------------------------------
# sample_from_probs


def test_sample_from_probs_inverse_cdf_rule():
    # Exactly representable probabilities; cumulative 0.125, 0.375, 0.375, 0.875, 1, 1.
    probs = torch.tensor([0.125, 0.25, 0.0, 0.5, 0.125, 0.0])
    cases = [(0.0, 0), (0.1, 0), (0.125, 1), (0.3, 1), (0.375, 3), (0.874, 3), (0.9, 4)]
    cases.append((1.0 - 2.0**-53, 4))  # the largest float64 uniform never reaches a zero tail
    uniforms = torch.tensor([u for u, _ in cases], dtype=torch.float64)
    expected = [t for _, t in cases]
    batch = probs.expand(len(cases), -1)
    assert sample_from_probs(batch, uniforms).tolist() == expected
    assert sample_from_probs(batch * 3.0, uniforms).tolist() == expected  # unnormalised
    assert sample_from_probs(torch.tensor([0.0, 0.0, 1.0]), torch.tensor(0.0, dtype=torch.float64)) == 2


def test_sample_from_probs_middle_dims():
    probs = torch.zeros(2, 3, 5)
    probs[..., 1] = 1.0
    probs[1, 2] = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.5])
    uniforms = torch.full((2, 3), 0.75, dtype=torch.float64)
    tokens = sample_from_probs(probs, uniforms)
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == [[1, 1, 1], [1, 1, 4]]


def empirical_counts(probs_row: torch.Tensor, seed: int) -> torch.Tensor:
    """Counts of NUM_DRAWS inverse-CDF draws from one distribution."""
    generator = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(NUM_DRAWS, generator=generator, dtype=torch.float64)
    tokens = sample_from_probs(probs_row.expand(NUM_DRAWS, -1), uniforms)
    return torch.bincount(tokens, minlength=probs_row.shape[-1])


SAMPLING_SETTINGS = [
    SamplingParams(),
    SamplingParams(temperature=0.6, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(min_p=0.1),
    SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05),
]


@pytest.mark.parametrize("params", SAMPLING_SETTINGS)
def test_sampling_matches_filtered_distribution(params):
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(7)) * 1.5
    probs = filtered_probs(logits, tensors_for(params))[0]
    assert chi_square_pvalue(empirical_counts(probs, seed=11), probs) > ALPHA


def test_chi_square_rejects_wrong_distributions():
    """Negative controls: the same test must notice a wrong temperature or a wrong top_k."""
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(7)) * 1.5
    drawn = filtered_probs(logits, tensors_for(SamplingParams(temperature=1.0)))[0]
    wrong = filtered_probs(logits, tensors_for(SamplingParams(temperature=1.3)))[0]
    assert chi_square_pvalue(empirical_counts(drawn, seed=11), wrong) < ALPHA
    drawn = filtered_probs(logits, tensors_for(SamplingParams(top_k=4)))[0]
    wrong = filtered_probs(logits, tensors_for(SamplingParams(top_k=3)))[0]
    assert chi_square_pvalue(empirical_counts(drawn, seed=11), wrong) < ALPHA


def test_greedy_sampling_always_takes_argmax():
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(3))
    probs = filtered_probs(logits, tensors_for(SamplingParams(temperature=0)))[0]
    counts = empirical_counts(probs, seed=5)
    assert counts[logits[0].argmax()] == NUM_DRAWS


# ---------------------------------------------------------------------------------------------
# no host synchronisation

SYNC_TOKENS = (".item(", ".tolist(", "nonzero", "masked_select", ".cpu(", ".numpy(", "argwhere")


@pytest.mark.parametrize("function", [filtered_probs, sample_from_probs])
def test_device_functions_have_no_sync_calls_in_source(function):
    source = inspect.getsource(function)
    assert not [token for token in SYNC_TOKENS if token in source]


def test_device_functions_run_on_meta_tensors():
    """Meta tensors have no data: any .item(), bool(), nonzero or boolean indexing raises."""
    st = tensors_for(SamplingParams(temperature=0), SamplingParams(top_k=3, top_p=0.5, min_p=0.1))
    st_meta = SamplingTensors(**{name: v.to("meta") if torch.is_tensor(v) else v for name, v in vars(st).items()})
    probs = filtered_probs(torch.empty(2, 3, 11, device="meta"), st_meta)
    assert probs.shape == (2, 3, 11) and probs.dtype == torch.float32
    tokens = sample_from_probs(probs, torch.empty(2, 3, dtype=torch.float64, device="meta"))
    assert tokens.shape == (2, 3) and tokens.dtype == torch.int64
