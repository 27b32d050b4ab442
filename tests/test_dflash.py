"""The DFlash drafter: z-lab's format, default layer ids, fit checks, and its forward against a
dense reference that follows docs/dflash.md literally (context K/V in front of the block's)."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from blockspec.config import ModelConfig
from blockspec.batch import decode_inputs
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.models.dflash import default_target_layer_ids, load_drafter
from dflash_fixtures import write_dflash_drafter


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(8, 2) == [1, 5]


def test_prefix_and_default_layer_ids(tmp_path, qwen3_dir):
    target = ModelConfig.load(qwen3_dir)
    a = load_drafter(write_dflash_drafter(tmp_path / "a", qwen3_dir, prefix=""), target, torch.float32, torch.device("cpu"))
    b = load_drafter(write_dflash_drafter(tmp_path / "b", qwen3_dir, prefix="model."), target, torch.float32, torch.device("cpu"))
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert a.config.target_layer_ids == tuple(default_target_layer_ids(target.num_layers, 2))


@pytest.mark.parametrize("override, field", [({"hidden_size": 32}, "hidden_size"), ({"vocab_size": 100}, "vocab_size"),
                                             ({"target_layer_ids": [0, 7]}, "target_layer_ids")])
def test_drafter_that_does_not_fit_is_refused(tmp_path, qwen3_dir, override, field):
    d = write_dflash_drafter(tmp_path / "bad", qwen3_dir, **override)
    with pytest.raises(ValueError, match=field):
        Engine(EngineConfig(model=qwen3_dir, spec="dflash", draft_model=str(d)))


def test_missing_drafter_is_refused(qwen3_dir):
    with pytest.raises(ValueError, match="draft"):
        Engine(EngineConfig(model=qwen3_dir, spec="dflash"))


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta, dim):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    f = pos.float()[:, None] * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    half = dim // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rot * sin[:, None]


def dense_draft_logits(sd, cfg, feats, block_emb, lm_head, theta):
    """docs/dflash.md (Architecture) written out densely for one sequence: context length T, block length S."""
    T, S = feats.shape[0], block_emb.shape[0]
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ctx = rms(feats @ sd["fc.weight"].T, sd["hidden_norm.weight"])
    pos = torch.arange(T + S)
    x = block_emb
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(S, nh, hd)
        q = rope(rms(q, sd[p + "self_attn.q_norm.weight"]), pos[T:], theta, hd)
        kv_in = torch.cat([ctx, h])
        k = (kv_in @ sd[p + "self_attn.k_proj.weight"].T).view(T + S, nkv, hd)
        k = rope(rms(k, sd[p + "self_attn.k_norm.weight"]), pos, theta, hd)
        v = (kv_in @ sd[p + "self_attn.v_proj.weight"].T).view(T + S, nkv, hd)
        g = nh // nkv
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
                                             v.repeat_interleave(g, 1).transpose(0, 1))
        x = x + att.transpose(0, 1).reshape(S, -1) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["norm.weight"]) @ lm_head.T


def test_drafter_forward_matches_dense_reference(tmp_path, qwen3_dir):
    d = write_dflash_drafter(tmp_path / "d", qwen3_dir, block_size=6, num_layers=2, target_layer_ids=[0, 1])
    cfg = json.loads((d / "config.json").read_text())
    engine = Engine(EngineConfig(model=qwen3_dir, spec="dflash", draft_model=str(d)))
    prop = engine.proposer
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 500, (11,), generator=torch.Generator().manual_seed(0)).tolist()
    from blockspec.sampling import SamplingParams
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()  # prefill: drafter context = the prompt's features
    seq = engine.scheduler.running[0]
    for _ in range(3):  # after prefill, then after each verify the context has grown
        check_drafter_against_dense(engine, prop, hf, cfg, seq)
        engine.step()


def check_drafter_against_dense(engine, prop, hf, cfg, seq):
    seq.page_table.reserve(engine.allocator, seq.num_cached + engine.lookahead)  # as the scheduler does
    inputs = decode_inputs([seq], torch.zeros(1, prop.max_depth + 1, dtype=torch.float64),
                           engine.cache.page_size, engine.device)
    captured = {}
    orig = prop.target.logits
    prop.target.logits = lambda h: captured.setdefault("logits", orig(h))
    prop.propose([seq], inputs)
    prop.target.logits = orig
    context = seq.tokens[:-1]
    assert seq.num_cached == len(context)
    with torch.no_grad():
        hs = hf(torch.tensor([context]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1][0] for i in cfg["dflash_config"]["target_layer_ids"]], -1)
        emb = hf.model.embed_tokens.weight
        block = torch.tensor([seq.last_token] + [cfg["dflash_config"]["mask_token_id"]] * 5)
        sd = {k: v.float() for k, v in prop.drafter.state_dict().items()}
        ref = dense_draft_logits(sd, cfg, feats, emb[block], hf.lm_head.weight, cfg["rope_theta"])
    torch.testing.assert_close(captured["logits"][0], ref[1:], rtol=1e-4, atol=1e-4)


def test_sliding_window_drafter_loads_and_runs(tmp_path, qwen3_dir):
    """`layer_types` with sliding layers (newer drafters): loads, masks per layer, and stays
    lossless in greedy decoding."""
    from blockspec.llm import LLM
    from blockspec.sampling import SamplingParams
    d = write_dflash_drafter(tmp_path / "sw", qwen3_dir, block_size=6, layer_types=["sliding_attention", "full_attention"],
                             sliding_window=4)
    spec = LLM(model=qwen3_dir, spec="dflash", draft_model=str(d))
    assert spec.engine.proposer.drafter.config.layer_window(0) == (4, True)
    assert spec.engine.proposer.drafter.config.layer_window(1) == (None, False)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = list(range(3, 20))
    assert spec.generate(prompt, params)[0].token_ids == LLM(model=qwen3_dir).generate(prompt, params)[0].token_ids
