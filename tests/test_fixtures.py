"""The tiny checkpoints load in transformers and have the properties other tests rely on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from fixtures import EOS_TOKEN, IM_END, MASK_TOKEN, special_token_ids, write_llama, write_qwen3

ALL_DIRS = ["llama_dir", "qwen2_dir", "qwen3_dir", "qwen3_sharded_dir", "tiny_vocab_dir"]


def read_config(model_dir) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def load(model_dir):
    """The model and transformers' loading report (missing / unexpected keys)."""
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


def stored_tensor_names(model_dir) -> set[str]:
    names = set()
    for shard in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    return names


@pytest.mark.parametrize("family", ALL_DIRS)
def test_loads_in_transformers_with_every_weight(request, family):
    model_dir = request.getfixturevalue(family)
    model, info = load(model_dir)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # norms were re-drawn around 1, not left at exactly 1
    norm = model.model.layers[0].input_layernorm.weight
    assert 0 < norm.std() < 0.3 and abs(norm.mean() - 1) < 0.1


@pytest.mark.parametrize("family", ALL_DIRS)
def test_tokenizer_fits_the_model(request, family):
    model_dir = request.getfixturevalue(family)
    vocab = read_config(model_dir)["vocab_size"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == vocab  # never larger than the model's vocabulary; here exactly equal
    ids = special_token_ids(vocab)
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == vocab - 1 == ids[MASK_TOKEN]
    assert tok.eos_token_id == ids[EOS_TOKEN] == read_config(model_dir)["eos_token_id"]
    generation = json.loads((Path(model_dir) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [ids[IM_END], ids[EOS_TOKEN]]
    assert tok.chat_template


def test_llama_has_llama3_rope_scaling_in_old_convention(llama_dir):
    raw = read_config(llama_dir)
    assert "rope_parameters" not in raw and raw["rope_theta"] == 500000.0
    assert raw["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = AutoConfig.from_pretrained(llama_dir)
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["rope_theta"] == 500000.0
    assert cfg.hidden_size == 64 and cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2
    assert cfg.head_dim == 16 and cfg.intermediate_size == 128 and cfg.max_position_embeddings == 512


def test_old_and_new_rope_conventions_load_to_the_same_model(llama_dir, tmp_path):
    """The hand-written old-convention config means the same model as the one transformers wrote."""
    new_dir = write_llama(tmp_path / "new", rope_convention="new")
    assert "rope_parameters" in read_config(new_dir) and "rope_scaling" not in read_config(new_dir)
    assert AutoConfig.from_pretrained(new_dir).rope_parameters == AutoConfig.from_pretrained(llama_dir).rope_parameters
    ids = torch.tensor([[5, 70, 300, 12, 99, 480, 3, 64, 200, 150]])
    with torch.no_grad():
        old_logits = load(llama_dir)[0](ids).logits
        new_logits = load(new_dir)[0](ids).logits
    torch.testing.assert_close(old_logits, new_logits, rtol=0, atol=0)


def test_both_rope_conventions_appear_among_fixtures(request):
    configs = [read_config(request.getfixturevalue(name)) for name in ALL_DIRS]
    assert any("rope_parameters" in c and "rope_theta" not in c for c in configs)
    assert any("rope_theta" in c and "rope_parameters" not in c for c in configs)


def test_qwen2_has_qkv_bias_only(qwen2_dir):
    attn = load(qwen2_dir)[0].model.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.bias is not None and proj.bias.abs().max() > 0.01
    assert attn.o_proj.bias is None
    assert (Path(qwen2_dir) / "chat_template.jinja").is_file()


def test_qwen3_ties_embeddings_and_has_qk_norms(qwen3_dir):
    assert read_config(qwen3_dir)["tie_word_embeddings"] is True
    assert "lm_head.weight" not in stored_tensor_names(qwen3_dir)
    model = load(qwen3_dir)[0]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (16,) and attn.k_norm.weight.std() > 0


def test_sharded_checkpoint_has_index_and_several_shards(qwen3_sharded_dir):
    root = Path(qwen3_sharded_dir)
    shards = sorted(root.glob("model-*.safetensors"))
    assert len(shards) >= 2 and not (root / "model.safetensors").exists()
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert set(index["weight_map"]) == stored_tensor_names(root)
    cfg = read_config(root)
    assert cfg["num_hidden_layers"] == 3 and cfg["tie_word_embeddings"] is False
    assert "lm_head.weight" in index["weight_map"]


def test_tiny_vocab_distributions_are_peaky_but_not_degenerate(tiny_vocab_dir):
    cfg = read_config(tiny_vocab_dir)
    assert cfg["vocab_size"] == 12 and cfg["hidden_size"] == 32 and cfg["num_hidden_layers"] == 2
    model = load(tiny_vocab_dir)[0]
    ids = torch.randint(0, 12, (8, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        probs = model(ids).logits.softmax(-1)
    entropy = -(probs * probs.log()).sum(-1)
    log_v = math.log(12)
    assert 0.3 * log_v < entropy.mean() < 0.85 * log_v
    assert entropy.min() > 0.1  # no position is (nearly) one-hot
    assert probs.max(-1).values.mean() > 2 / 12  # clearly peakier than uniform


def test_builders_are_deterministic_and_leave_global_rng_alone(tmp_path):
    state = torch.get_rng_state()
    a = write_qwen3(tmp_path / "a", num_layers=2)
    b = write_qwen3(tmp_path / "b", num_layers=2)
    assert torch.equal(state, torch.get_rng_state())
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    c = write_qwen3(tmp_path / "c", num_layers=2, seed=7)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
