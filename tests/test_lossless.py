"""Speculative sampling is distributed exactly as the target (docs/verification.md).

For a target over a 12-token vocabulary the joint law of the first 3 generated tokens is
enumerated exactly (12³ cells) from transformers' forward; ≥ 20,000 seeded speculative
requests must pass a chi-square goodness-of-fit test at α = 1e-3, and a deliberately biased
verifier (one that over-accepts drafts, like a relaxed threshold) must fail the same test.
"""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import blockspec.speculative.step as step_module
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.speculative.verify import verify_tree
from blockspec.validation.lossless import chi_square_against_law, exact_joint_law, sample_continuations
from dflash_fixtures import write_dflash_drafter

# The exact-law tests run on the CPU in `make test`; on a CUDA machine
# `BLOCKSPEC_TEST_DEVICE=cuda pytest tests/test_lossless.py tests/test_ddtree.py` runs the engine on
# the GPU path (Triton attention, CUDA graphs) against the same CPU-computed laws.
TEST_DEVICE = os.environ.get("BLOCKSPEC_TEST_DEVICE", "cpu")

ALPHA = 1e-3
NUM_SAMPLES = 20_000
NUM_TOKENS = 3
PROMPT = [1, 4, 2, 7]
SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t07_topk5": SamplingParams(temperature=0.7, top_k=5),
    "t13_topp_minp": SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05),
}
# (block size, verification, setting): every block size, both verifiers, every setting.
CASES = [(2, "target-only", "t13_topp_minp"), (4, "target-only", "t1"), (8, "target-only", "t07_topk5"),
         (2, "rejection", "t07_topk5"), (4, "rejection", "t13_topp_minp"), (8, "rejection", "t1")]


def exact_laws(model_dir, settings=SETTINGS) -> dict:
    """The exact law of the first NUM_TOKENS tokens after PROMPT under each setting, enumerated
    from transformers' forward of `model_dir`."""
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def next_logits(seqs):
        with torch.no_grad():
            return hf(torch.tensor(seqs)).logits[:, -1]
    return {name: exact_joint_law(next_logits, PROMPT, p, hf.config.vocab_size, NUM_TOKENS)
            for name, p in settings.items()}


@pytest.fixture(scope="module")
def laws(tiny_vocab_dir):
    return exact_laws(tiny_vocab_dir)


@pytest.fixture(scope="module")
def drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("tiny_drafter"), tiny_vocab_dir, block_size=8, std=0.3))


def exact_law_llm(model, kv_tokens_per_request: int, **spec) -> LLM:
    """An engine that takes all NUM_SAMPLES seeded requests of PROMPT in one batch."""
    return LLM(model=model, max_running_requests=4096, max_prefill_tokens=4096 * len(PROMPT),
               kv_cache_tokens=4096 * kv_tokens_per_request, page_size=4, detokenize=False, device=TEST_DEVICE,
               **spec)


def law_fit(llm, laws, setting, settings=SETTINGS, seeded=False):
    """Chi-square of the engine's first NUM_TOKENS tokens under settings[setting] against the
    exact law of that setting. Unseeded requests by default (the verifiers' uniforms); seeded
    ones sample by the exponential race (blockspec/seeded_sampling.py)."""
    samples = sample_continuations(llm, PROMPT, settings[setting], NUM_SAMPLES, NUM_TOKENS, seeded=seeded)
    return chi_square_against_law(samples, laws[setting])


def spec_llm(model, drafter, block, verify):
    return exact_law_llm(model, 24, spec="dflash", draft_model=drafter, block_size=block, spec_verify=verify)


@pytest.mark.parametrize("block, verify, setting", CASES)
def test_speculative_sampling_matches_exact_law(tiny_vocab_dir, drafter, laws, block, verify, setting):
    llm = spec_llm(tiny_vocab_dir, drafter, block, verify)
    result = law_fit(llm, laws, setting)
    assert result.p_value > ALPHA, f"{block=} {verify=} {setting=}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def over_accepting_verify_tree(target_probs, node_tokens, parents, uniforms):
    """A biased verifier: doubles the probability of every drafted child before the walk."""
    B, W, V = target_probs.shape
    child_of = torch.zeros(B, W, V)
    for i in range(1, W):
        par = parents[:, i]
        ok = par >= 0
        child_of[ok.nonzero()[:, 0], par[ok], node_tokens[ok, i]] = 1.0
    boosted = target_probs * (1 + child_of)
    return verify_tree(boosted / boosted.sum(-1, keepdim=True), node_tokens, parents, uniforms)


def test_negative_control_biased_verifier_fails(tiny_vocab_dir, drafter, laws, monkeypatch):
    monkeypatch.setattr(step_module, "verify_tree", over_accepting_verify_tree)
    result = law_fit(spec_llm(tiny_vocab_dir, drafter, 4, "target-only"), laws, "t1")
    assert result.p_value < ALPHA, f"biased verifier passed: p={result.p_value:.3f}"


def test_plain_sampling_matches_exact_law(tiny_vocab_dir, laws):
    """The reference itself: plain (non-speculative) sampling from the engine fits the law."""
    assert law_fit(exact_law_llm(tiny_vocab_dir, 12), laws, "t13_topp_minp").p_value > ALPHA
