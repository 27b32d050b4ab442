"""Speculation on mixture-of-experts targets: greedy DFlash and DDTree equal plain greedy on
DeepSeek-V3 (MLA, latent cache, compaction after trees) and Qwen3-MoE; DDTree sampling on a
12-token DeepSeek-V3 target matches the exact law (tests/test_lossless.py), and a biased
verifier fails the same test there."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import blockspec.speculative.step as step_module
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.validation.lossless import chi_square_against_law, exact_joint_law, sample_continuations
from dflash_fixtures import write_dflash_drafter
from moe_fixtures import write_deepseek_v3
from test_lossless import ALPHA, NUM_TOKENS, PROMPT, SETTINGS, exact_law_llm, law_fit, over_accepting_verify_tree
from test_spec_greedy import prompts_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("family", ["deepseek_dir", "qwen3_moe_dir"])
def test_greedy_speculative_equals_plain(family, request, tmp_path):
    model_dir = request.getfixturevalue(family)
    drafter = str(write_dflash_drafter(tmp_path / "drafter", model_dir, block_size=4, std=0.2))
    prompts = prompts_for(512, [7, 19])
    plain = LLM(model=model_dir)
    assert plain.engine.proposer is None
    expected = [o.token_ids for o in plain.generate(prompts, GREEDY)]
    for spec in (dict(spec="dflash"), dict(spec="ddtree", tree_budget=6)):
        llm = LLM(model=model_dir, draft_model=drafter, **spec)
        assert llm.engine.runner.capture_layers == llm.engine.proposer.target_layer_ids != ()
        assert llm.generate(prompts[0], GREEDY)[0].token_ids == expected[0]
        outs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == expected, spec
        assert sum(o.metrics.verify_steps for o in outs) > 0
        assert llm.engine.allocator.num_used_pages == 0


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """DeepSeek-V3 over 12 tokens (MLA without q_lora, 8 experts in 4 groups, hidden 32) with a
    one-layer drafter and the exact law."""
    model = str(write_deepseek_v3(tmp_path_factory.mktemp("tiny_moe"), vocab_size=12, seed=7, std=0.15,
                                  embed_std=0.25, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                                  num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None,
                                  qk_nope_head_dim=8, v_head_dim=8, n_group=4, topk_group=2))
    drafter = str(write_dflash_drafter(tmp_path_factory.mktemp("tiny_moe_drafter"), model, block_size=4, std=0.3,
                                       num_layers=1))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    def next_logits(seqs):
        with torch.no_grad():
            return hf(torch.tensor(seqs)).logits[:, -1]
    return model, drafter, {"t1": exact_joint_law(next_logits, PROMPT, SETTINGS["t1"], 12, NUM_TOKENS)}


def ddtree_llm(model, drafter):
    # Target-only (the rule the over-accepting control below breaks); sampled trees: test_sampled_tree_engine.py.
    return exact_law_llm(model, 20, spec="ddtree", draft_model=drafter, budget=4, spec_verify="target-only")


def test_ddtree_sampling_on_moe_matches_exact_law(tiny_moe):
    model, drafter, laws = tiny_moe
    llm = ddtree_llm(model, drafter)
    result = law_fit(llm, laws, "t1")
    assert result.p_value > ALPHA, f"chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def test_biased_verifier_on_moe_fails(tiny_moe, monkeypatch):
    """The same test with a verifier that over-accepts drafts; a fifth of the samples already
    reject it (keeping the suite fast)."""
    model, drafter, laws = tiny_moe
    monkeypatch.setattr(step_module, "verify_tree", over_accepting_verify_tree)
    samples = sample_continuations(ddtree_llm(model, drafter), PROMPT, SETTINGS["t1"], 4000, NUM_TOKENS, seeded=False)
    assert chi_square_against_law(samples, laws["t1"]).p_value < ALPHA
