"""Seeded sampling by the exponential race (blockspec/seeded_sampling.py): the kernel equals the
torch reference, the race samples the target's exact law (and its negative control, noise shared
across positions, fails the same test), through the engine too."""

import pytest
import torch
from scipy import stats

import blockspec.seeded_sampling as race
from blockspec.seeded_sampling import (pin_seeded_rows, race_key, race_noise, race_scores, race_winners,
                                      race_winners_on_support)
from test_lossless import ALPHA, exact_law_llm, law_fit
from test_lossless import drafter, laws  # noqa: F401  (fixtures)


def _probs(B, N, V, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(B, N, V, generator=g) * 3, -1)
    probs[0, -1, V // 3:] = 0.0                       # a filtered support
    return (probs / probs.sum(-1, keepdim=True)).to(dtype)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Under the interpreter float32 and float16 (bf16 loads misread there); CUDA adds bf16 and a real vocabulary.
KERNEL_CASES = [(torch.float32, 37), (torch.float16, 200)] + (
    [(torch.bfloat16, 151_936), (torch.float32, 151_936)] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype, V", KERNEL_CASES)
def test_kernel_equals_the_torch_reference(dtype, V):
    """Under Triton's interpreter on a CPU, natively on CUDA: the pin and the scores."""
    B, N = 4, 3
    probs = _probs(B, N, V, dtype).to(DEVICE)
    keys = torch.tensor([race_key(1), 0, race_key(2), race_key(3)], device=DEVICE)
    positions = (torch.arange(N)[None, :] + torch.tensor([[5], [0], [9], [2**33]])).to(DEVICE)
    reference = pin_seeded_rows(probs.clone(), keys, positions, kernel=False)
    kernel = pin_seeded_rows(probs.clone(), keys, positions, kernel=True)
    assert torch.equal(kernel, reference)
    assert torch.equal(reference[1], probs[1])                         # key 0: untouched
    assert torch.equal(reference[0].argmax(-1), race_winners(probs, keys, positions)[0])
    s_ref, s_ker = (race_scores(probs, keys, positions, kernel=k) for k in (False, True))
    finite = torch.isfinite(s_ref)
    assert torch.equal(finite, torch.isfinite(s_ker))
    assert torch.allclose(s_ker[finite], s_ref[finite], atol=1e-4)
    # The scores rank a seeded row's tokens in race order: the first is the winner.
    assert torch.equal(s_ref[[0, 2, 3]].argmax(-1), race_winners(probs, keys, positions)[[0, 2, 3]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("support", ["filtered", "full"])
def test_winners_from_the_support_equal_the_full_race(dtype, support, monkeypatch):
    """The CPU's race hashes only tokens with p > 0 where they are few (`SPARSE_SHARE`), every
    token elsewhere: the same winners as the whole vocabulary's race either way, over filtered
    and full supports, one token, and a position with no mass (token 0)."""
    B, N, V = 6, 4, 500
    probs = _probs(B, N, V, dtype, seed=4)
    if support == "filtered":                         # top-p-like supports: 20 tokens a position
        cut = probs.float().topk(20, -1).values[..., -1:]
        probs = torch.where(probs.float() >= cut, probs.float(), 0.0).to(dtype)
    probs[1, :, 40:] = 0.0
    probs[2, 1] = 0.0
    probs[2, 1, 321] = 1.0
    probs[3, 2] = 0.0
    keys = torch.tensor([race_key(i) for i in range(1, B + 1)])
    positions = torch.arange(N)[None, :] + 17 * torch.arange(B)[:, None]
    expected = race_winners(probs, keys, positions)
    dense_calls = []
    monkeypatch.setattr(race, "race_winners", lambda *a: dense_calls.append(1) or race_winners(*a))
    assert torch.equal(race_winners_on_support(probs, keys, positions), expected)
    assert bool(dense_calls) == (support == "full")  # the branch the support's size picks
    assert expected[2, 1] == 321 and expected[3, 2] == 0
    # The pin (torch path) and the scores' order use the support alone too.
    pinned = pin_seeded_rows(probs.clone(), keys, positions, kernel=False)
    assert torch.equal(pinned.argmax(-1), expected) and torch.equal(pinned.sum(-1), torch.ones(B, N, dtype=dtype))
    scores = race_scores(probs, keys, positions, kernel=False)
    full = torch.log(probs.float()) - torch.log(race_noise(keys, positions, V))
    assert torch.equal(scores, full)


def test_the_top_hash_value_gives_finite_noise():
    """Seed 2's hash at position 323, token 414 is the top 24-bit value, whose midpoint rounds to
    1.0 in float32: capped below 1, its noise is positive and its score finite (E = 0 gave +inf,
    and a NaN depth after the log-softmax)."""
    keys, positions = torch.tensor([race_key(2)]), torch.tensor([[323]])
    s, t = race._position_states(keys, positions)
    h = race._fmix32(race._fmix32(torch.tensor(414) ^ s) ^ t)
    assert int(h >> 8) == (1 << 24) - 1                           # the case this test is about
    V = 1000
    assert race_noise(keys, positions, V)[0, 0, 414] > 0
    probs = torch.softmax(torch.randn(1, 1, V, generator=torch.Generator().manual_seed(0)), -1)   # full support
    for kernel in (False, True):
        device = DEVICE if kernel else "cpu"
        scores = race_scores(probs.to(device), keys.to(device), positions.to(device), kernel=kernel)
        assert torch.isfinite(scores).all() and torch.isfinite(torch.log_softmax(scores, -1)).all(), kernel


def test_keys_are_nonzero_and_distinct():
    keys = {race_key(s) for s in range(-1000, 1000)}
    assert len(keys) == 2000 and 0 not in keys


def _pairs(monkeypatch=None, n=20_000):
    """The race's tokens at two positions of one law over 5 tokens, for n keys → joint counts."""
    p = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05])
    keys = torch.tensor([race_key(i) for i in range(n)])
    winners = race_winners(p.expand(n, 2, 5).contiguous(), keys, torch.tensor([[7, 8]]).expand(n, 2))
    counts = torch.bincount(winners[:, 0] * 5 + winners[:, 1], minlength=25).double()
    return counts, torch.outer(p, p).flatten().double() * n


def test_the_race_draws_independent_exact_samples():
    counts, expected = _pairs()
    assert stats.chisquare(counts, expected).pvalue > ALPHA


def test_negative_control_noise_shared_across_positions_fails(monkeypatch):
    """Keyed by the request alone (not the position), every position reruns the same race: each
    marginal is still exact, the joint law is not."""
    real = race._position_states
    monkeypatch.setattr(race, "_position_states", lambda keys, positions: real(keys, torch.zeros_like(positions)))
    counts, expected = _pairs()
    assert stats.chisquare(counts, expected).pvalue < ALPHA


@pytest.mark.parametrize("spec, verify, setting", [("dflash", "rejection", "t13_topp_minp"),
                                                   ("ddtree", "rejection", "t1"),
                                                   ("none", None, "t07_topk5")])
def test_seeded_engine_sampling_matches_exact_law(tiny_vocab_dir, drafter, laws, spec, verify, setting):  # noqa: F811
    """20,000 seeded requests (seeds 0 … N − 1) through the engine against the enumerated law."""
    extra = {} if spec == "none" else dict(spec=spec, draft_model=drafter, spec_verify=verify,
                                           **({"budget": 7} if spec == "ddtree" else {"block_size": 4}))
    llm = exact_law_llm(tiny_vocab_dir, 24, **extra)
    result = law_fit(llm, laws, setting, seeded=True)
    assert result.p_value > ALPHA, f"{spec=}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


def test_negative_control_seeded_engine_with_shared_noise_fails(tiny_vocab_dir, drafter, laws, monkeypatch):  # noqa: F811
    """Every position's race run with position 0's noise, at the call sites (so the kernel on
    CUDA and the torch path on a CPU both see it)."""
    import blockspec.engine.prefill_graphs as prefill_module
    import blockspec.speculative.proposers as proposers_module
    import blockspec.speculative.step as step_module
    for module in (step_module, proposers_module, prefill_module):
        real = module.pin_seeded_rows
        monkeypatch.setattr(module, "pin_seeded_rows",
                            lambda probs, keys, positions, real=real: real(probs, keys, torch.zeros_like(positions)))
    llm = exact_law_llm(tiny_vocab_dir, 24, spec="dflash", draft_model=drafter, block_size=4, spec_verify="rejection")
    assert law_fit(llm, laws, "t1", seeded=True).p_value < ALPHA

