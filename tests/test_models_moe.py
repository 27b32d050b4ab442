"""DeepSeek-V3 / Kimi K2 (MLA, routed experts) and Qwen3-MoE against transformers' own classes:
logits, greedy generation alone and batched, the routers, the experts' grouped products, the
latent cache's size, and what the loader refuses or skips."""

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from blockspec import LLM, SamplingParams
from blockspec.config import MoEConfig
from blockspec.config_deepseek import DeepseekV3Config
from blockspec.layers import moe as moe_module
from blockspec.layers.moe import GroupedExperts, route, stack_expert_weights
from blockspec.models.loader import load_target
from blockspec.models.registry import load_config
from moe_fixtures import write_deepseek_v3
from test_models import hf_greedy

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5}
# name → write_deepseek_v3 overrides: q_lora none with group-limited routing; YaRN (both of its
# scales ≠ 1) with non-interleaved RoPE; Kimi K2's model_type.
DEEPSEEK_VARIANTS = {
    "no_q_lora_groups": dict(q_lora_rank=None, n_group=4, topk_group=2),
    "yarn": dict(rope_parameters=YARN, max_position_embeddings=128, rope_interleave=False),
    "kimi_k2": dict(model_type="kimi_k2", n_group=2, topk_group=1),
}


@pytest.fixture(scope="module")
def variant_dirs(tmp_path_factory):
    return {name: str(write_deepseek_v3(tmp_path_factory.mktemp(name), **kw)) for name, kw in DEEPSEEK_VARIANTS.items()}


def our_logits(model, ids):
    from blockspec.attention.metadata import AttentionBatch, causal_new_mask
    from blockspec.kv.allocator import PageAllocator, PageTable
    B, T = ids.shape
    alloc = PageAllocator(64, 8)
    cache = model.cache_spec.allocate(64, 8, torch.float32, "cpu")
    tables = [PageTable(8) for _ in range(B)]
    for t in tables:
        t.reserve(alloc, T)
    batch = AttentionBatch(torch.tensor([[t.slot(p) for p in range(T)] for t in tables]), torch.tensor([t.pages for t in tables]),
                           torch.zeros(B, dtype=torch.long), torch.full((B,), T), causal_new_mask(B, T, "cpu"))
    hidden, features = model(ids, torch.arange(T).expand(B, T), cache, batch, capture_layers=(0,))
    return model.logits(hidden), features


def reference_dir(name, request, variant_dirs):
    if name in ("deepseek_dir", "qwen3_moe_dir"):
        return request.getfixturevalue(name)
    return variant_dirs[name]


@pytest.mark.parametrize("name", ["deepseek_dir", *DEEPSEEK_VARIANTS, "qwen3_moe_dir"])
def test_logits_and_captured_features_match_transformers(name, request, variant_dirs):
    model_dir = reference_dir(name, request, variant_dirs)
    if name == "kimi_k2":
        assert json.load(open(f"{model_dir}/config.json"))["model_type"] == "kimi_k2"
        config = json.load(open(f"{model_dir}/config.json"))
        ref_dir = model_dir + "_as_deepseek"       # transformers knows the architecture, not kimi_k2
        import shutil
        shutil.copytree(model_dir, ref_dir, dirs_exist_ok=True)
        json.dump({**config, "model_type": "deepseek_v3"}, open(f"{ref_dir}/config.json", "w"))
    else:
        ref_dir = model_dir
    hf = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    ours = load_target(model_dir, "float32", "cpu")
    ids = torch.randint(0, ours.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    logits, features = our_logits(ours, ids)
    assert (logits - ref.logits).abs().max() <= 1e-4
    assert (features - ref.hidden_states[1]).abs().max() <= 1e-4      # DFlash's capture of layer 0
    assert ref.logits.abs().max() > 1.0                                # the fixture is not degenerate


@pytest.mark.parametrize("name", ["deepseek_dir", "qwen3_moe_dir"])
def test_greedy_64_tokens_alone_and_batched_match_transformers(name, request):
    model_dir = request.getfixturevalue(name)
    gen = torch.Generator().manual_seed(1)
    llm = LLM(model=model_dir, dtype="float32", device="cpu")
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 17, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, 64)
    assert llm.generate(prompts[0], params)[0].token_ids == expected[0]
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.engine.allocator.num_used_pages == 0


def test_routers_equal_transformers():
    """Sigmoid + correction bias + groups (DeepSeek) and softmax (Qwen3-MoE): the same experts
    and weights as transformers' routers; the bias changes the choice, never the weights."""
    from transformers import DeepseekV3Config as HFDeepseek, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 16, generator=gen)
    hf = DeepseekV3TopkRouter(HFDeepseek(hidden_size=16, n_routed_experts=16, num_experts_per_tok=3, n_group=4,
                                         topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True))
    hf.weight.data = torch.randn(16, 16, generator=gen)
    hf.e_score_correction_bias.data = 0.3 * torch.randn(16, generator=gen)
    cfg = MoEConfig(16, 3, 8, "sigmoid", True, True, 2.5, 4, 2)
    _, hf_w, hf_ids = hf(x)
    w, ids = route(x @ hf.weight.T, cfg, hf.e_score_correction_bias)
    order, hf_order = ids.argsort(-1), hf_ids.argsort(-1)
    assert torch.equal(ids.gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(w.gather(1, order), hf_w.gather(1, hf_order))
    _, unbiased = route(x @ hf.weight.T, cfg, None)
    assert not torch.equal(unbiased.sort(-1)[0], ids.sort(-1)[0])

    qr = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=16, num_experts=16, num_experts_per_tok=3, norm_topk_prob=True))
    qr.weight.data = torch.randn(16, 16, generator=gen)
    _, q_w, q_ids = qr(x)
    w, ids = route(x @ qr.weight.T, MoEConfig(16, 3, 8, "softmax", norm_topk_prob=True))
    assert torch.equal(ids, q_ids)
    torch.testing.assert_close(w, q_w)


@pytest.mark.parametrize("grouped", [True, False])
def test_experts_equal_a_per_expert_loop(grouped, monkeypatch):
    """The grouped product and its gathered fallback against one product per (token, choice)."""
    if not grouped:
        monkeypatch.setattr(moe_module, "grouped_mm_works", lambda *a: False)
    gen = torch.Generator().manual_seed(0)
    experts = GroupedExperts(16, MoEConfig(num_experts=6, top_k=2, intermediate_size=8))
    experts.gate_up_proj.data = torch.randn(6, 16, 16, generator=gen) / 4
    experts.down_proj.data = torch.randn(6, 16, 8, generator=gen) / 4
    x = torch.randn(9, 16, generator=gen)
    ids = torch.randint(0, 5, (9, 2), generator=gen)          # expert 5 is never hit
    weights = torch.rand(9, 2, generator=gen)
    want = torch.zeros_like(x)
    for t in range(9):
        for j in range(2):
            gate, up = (experts.gate_up_proj[ids[t, j]] @ x[t]).chunk(2)
            want[t] += weights[t, j] * (experts.down_proj[ids[t, j]] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(experts(x, ids, weights), want, rtol=1e-5, atol=1e-5)


def test_recorded_expert_hits_are_the_last_forwards_choices():
    """`record_expert_hits`: a persistent `[E]` mask, rewritten in place by every forward (the
    Kimi-slice benchmark's floor counts it after graph replays, which only in-place writes survive)."""
    from blockspec.layers.moe import MoE
    torch.manual_seed(0)
    moe = MoE(16, MoEConfig(num_experts=12, top_k=3, intermediate_size=8))
    moe.gate.weight.data = torch.randn(12, 16)
    for p in moe.experts.parameters():
        p.data = torch.randn_like(p) / 4
    moe.record_expert_hits()
    buffer = moe.expert_hits
    for rows in (1, 5):
        x = torch.randn(1, rows, 16)
        moe(x)
        _, ids = moe.gate(x.reshape(rows, 16))
        assert moe.expert_hits is buffer                              # written in place
        assert set(buffer.nonzero().flatten().tolist()) == set(ids.flatten().tolist())
    assert int(buffer.sum()) <= 12


def test_stack_expert_weights_names_a_missing_expert():
    state = {f"m.experts.{e}.{n}.weight": torch.zeros(2, 2) for e in range(3) for n in ("gate_proj", "up_proj", "down_proj")}
    del state["m.experts.1.up_proj.weight"]
    with pytest.raises(ValueError, match=r"m\.experts\.1\.up_proj"):
        stack_expert_weights(state)


KIMI_K2 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
           "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384, "num_experts_per_tok": 8,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
           "routed_scaling_factor": 2.827, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
           "vocab_size": 163840, "max_position_embeddings": 262144, "rope_theta": 50000.0,
           "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}


def test_kimi_config_latent_cache_bytes_and_yarn_scale():
    from blockspec.models.registry import architecture_of
    cfg = architecture_of(KIMI_K2).parse_config(KIMI_K2)
    assert isinstance(cfg, DeepseekV3Config) and cfg.moe.num_experts == 384
    with torch.device("meta"):
        from blockspec.models.deepseek_v3 import DeepseekV3ForCausalLM
        model = DeepseekV3ForCausalLM(cfg)
    assert model.cache_spec.bytes_per_token(torch.bfloat16) == (512 + 64) * 2 * 61 == 70_272
    mscale = 0.1 * math.log(64.0) + 1
    assert math.isclose(model.model.layers[0].self_attn.scale, 192 ** -0.5 * mscale ** 2)
    assert model.rotary.attention_factor == 1.0           # mscale / mscale_all_dim


def test_engine_reports_latent_bytes_per_token(deepseek_dir, caplog):
    with caplog.at_level(logging.INFO, logger="blockspec.engine"):
        llm = LLM(model=deepseek_dir, dtype="float32")
    assert llm.engine.kv_bytes_per_token == (32 + 8) * 4 * 2
    assert f"{(32 + 8) * 4 * 2} bytes per token" in caplog.text and "LatentCacheSpec" in caplog.text


def test_router_stays_float32_and_mtp_layers_are_skipped(tmp_path, caplog):
    d = write_deepseek_v3(tmp_path / "ds", num_layers=2)
    state = load_file(str(d / "model.safetensors"))
    state["model.layers.2.self_attn.kv_b_proj.weight"] = torch.zeros(4, 4)     # a multi-token-prediction layer
    save_file(state, str(d / "model.safetensors"))
    with caplog.at_level(logging.INFO, logger="blockspec.models"):
        model = load_target(str(d), "bfloat16", "cpu")
    assert "layers ≥ 2" in caplog.text
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32 and gate.e_score_correction_bias.dtype == torch.float32
    torch.testing.assert_close(gate.e_score_correction_bias, state["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert model.lm_head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("key,value,match", [("scoring_func", "softmax", "scoring_func"),
                                             ("n_group", 3, "n_group"), ("num_experts_per_tok", 9, "num_experts_per_tok"),
                                             ("moe_layer_freq", 2, "moe_layer_freq")])
def test_unsupported_routing_is_refused(tmp_path, deepseek_dir, key, value, match):
    config = {**json.load(open(f"{deepseek_dir}/config.json")), key: value}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        load_config(tmp_path)
