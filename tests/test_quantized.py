"""Quantised checkpoints (DeepSeek FP8 blocks, compressed-tensors pack-quantized INT4) load as
their dequantised reference, and a kimi_k25 wrapper loads as its text model."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from blockspec.layers.int4_linear import Int4Linear
from blockspec.layers.packed_int import dequantize_packed, pack_int32, quantize_symmetric, unpack_int32
from blockspec.models.loader import load_target
from blockspec.models.quantized import dequantize_fp8_block, quantization_of
from quant_fixtures import fp8_block_quantize, fp8_copy, int4_copy, kimi_k25_copy
from test_models import our_logits

from compressed_tensors.compressors.pack_quantized import helpers as pack_quantized  # noqa: E402  (dev dependency)


# ---- the formats' math ---------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [64, 37])
def test_packing_matches_compressed_tensors_both_ways(bits, k):
    values = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (6, k), dtype=torch.int8,
                           generator=torch.Generator().manual_seed(k))
    theirs = pack_quantized.pack_to_int32(values, bits)
    assert torch.equal(pack_int32(values, bits), theirs)
    assert torch.equal(unpack_int32(theirs, bits, k), values)
    assert torch.equal(pack_quantized.unpack_from_int32(pack_int32(values, bits), bits, torch.Size([6, k])), values)


def test_int4_nibbles_are_offset_by_eight():
    """Value -8 is nibble 0 and 7 is nibble 15, least significant nibble first."""
    values = torch.tensor([[-8, 7, 0, 1, -1, 2, -2, 3]], dtype=torch.int8)
    word = pack_int32(values, 4)[0, 0].item() & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [0, 15, 8, 9, 7, 10, 6, 11]


def test_dequantize_packed_ragged_groups():
    """K = 80 in groups of 32: the last group has 16 columns and its own scale."""
    w = torch.randn(5, 80, generator=torch.Generator().manual_seed(0))
    values, scale = quantize_symmetric(w, 32)
    assert scale.shape == (5, 3)
    out = dequantize_packed(pack_int32(values, 4), scale, 80, 32)
    assert torch.equal(out[:, 64:], values[:, 64:].float() * scale[:, 2:3])
    assert (out - w).abs().max() <= scale.max() / 2 + 1e-6         # round to nearest


def test_fp8_blocks_broadcast_over_ragged_edges():
    w = torch.randn(70, 100, generator=torch.Generator().manual_seed(1))
    fp8, scale_inv, ref = fp8_block_quantize(w, (32, 48))              # 3×3 blocks, the last ones short
    assert scale_inv.shape == (3, 3)
    assert torch.equal(dequantize_fp8_block(fp8, scale_inv, (32, 48)), ref)
    with pytest.raises(ValueError, match="weight_scale_inv has shape"):
        dequantize_fp8_block(fp8, scale_inv[:2], (32, 48))


# ---- checkpoints end to end --------------------------------------------------------------------

@pytest.fixture(scope="module")
def quantised_dirs(tmp_path_factory):
    """(FP8 dir, its reference), (INT4 dir, its reference), from an untied Qwen3."""
    from fixtures import write_qwen3
    src = write_qwen3(tmp_path_factory.mktemp("qwen3_untied"), tie_word_embeddings=False)
    out = tmp_path_factory.mktemp("quantised")
    return {"fp8": fp8_copy(src, out), "int4": int4_copy(src, out)}


def assert_same_model(model, reference):
    ours, ref = model.state_dict(), reference.state_dict()
    assert ours.keys() == ref.keys()
    for k in ref:
        assert torch.equal(ours[k], ref[k]), k
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(our_logits(model, ids), our_logits(reference, ids))


@pytest.mark.parametrize("fmt, stored", [("fp8", "fp8 e4m3, 32x48 blocks"), ("int4", "pack-quantized int4")])
def test_quantised_checkpoint_loads_as_its_dequantised_reference(quantised_dirs, fmt, stored, caplog):
    quant_dir, ref_dir = quantised_dirs[fmt]
    with caplog.at_level(logging.INFO, logger="blockspec"):
        model = load_target(quant_dir, "float32")
    assert_same_model(model, load_target(ref_dir, "float32"))
    lines = [r.getMessage() for r in caplog.records if "quantised weights" in r.getMessage()]
    assert len(lines) == 1 and stored in lines[0] and "dequantised to float32" in lines[0]
    assert " KiB as stored -> " in lines[0] and " KiB in memory (+" in lines[0]


def test_dequantised_reference_matches_transformers(quantised_dirs):
    """The reference checkpoints are ordinary dense ones: transformers computes the same logits."""
    from transformers import AutoModelForCausalLM
    _, ref_dir = quantised_dirs["int4"]
    hf = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    ours = load_target(quantised_dirs["int4"][0], "float32")
    ids = torch.randint(0, ours.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        assert ((our_logits(ours, ids) - ref).abs().max() / ref.abs().max()) < 1e-4


def test_int4_linears_keep_weights_packed(quantised_dirs, caplog):
    quant_dir, ref_dir = quantised_dirs["int4"]
    with caplog.at_level(logging.INFO, logger="blockspec"):
        model = load_target(quant_dir, "float32", int4_linears=True)
    packed = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert len(packed) == 3 * model.config.num_layers                # gate, up, down per layer
    assert packed[0].weight_packed.dtype == torch.int32
    assert all(m.weight_packed.stride(0) == m.weight_scale.stride(0) == 1 for m in packed)   # loaded N-major
    assert "6 kept packed" in caplog.text
    reference = load_target(ref_dir, "float32")
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(our_logits(model, ids), our_logits(reference, ids))   # CPU: dequantise, then F.linear
        for m in packed:
            m.kernel = True                                                   # the Triton kernel (interpreted)
        kernel = our_logits(model, ids)
        ref = our_logits(reference, ids)
    assert (kernel - ref).abs().max() / ref.abs().max() < 1e-5


def test_kimi_k25_wrapper_loads_its_text_model(quantised_dirs, tmp_path, caplog):
    """Weights under language_model. are the text model's; the vision weights are skipped with
    one log line; a top-level quantization_config applies to the prefixed names."""
    quant_dir, ref_dir = quantised_dirs["int4"]
    wrapped = kimi_k25_copy(quant_dir, tmp_path / "kimi")
    with caplog.at_level(logging.INFO, logger="blockspec"):
        model = load_target(wrapped, "float32")
    skipped = [r.getMessage() for r in caplog.records if "vision weights" in r.getMessage()]
    assert len(skipped) == 1 and "skipped 3 vision weights" in skipped[0]
    assert model.config.architecture == "Qwen3ForCausalLM"
    assert model.config.eos_token_ids                                     # taken from the wrapper
    assert_same_model(model, load_target(ref_dir, "float32"))


def test_kimi_k25_text_config_quantization_and_engine(quantised_dirs, tmp_path):
    """quantization_config inside text_config is found too, and the engine serves the wrapper."""
    from blockspec import LLM, SamplingParams
    quant_dir, ref_dir = quantised_dirs["fp8"]
    wrapped = kimi_k25_copy(quant_dir, tmp_path / "kimi")
    config = json.loads((wrapped / "config.json").read_text())
    config["text_config"]["quantization_config"] = config.pop("quantization_config")
    (wrapped / "config.json").write_text(json.dumps(config))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = [[1, 2, 3, 4]]
    ours = LLM(model=str(wrapped), dtype="float32", device="cpu").generate(prompt, params)
    ref = LLM(model=str(ref_dir), dtype="float32", device="cpu").generate(prompt, params)
    assert ours[0].token_ids == ref[0].token_ids and len(ours[0].token_ids) == 8


# ---- bad checkpoints ------------------------------------------------------------------------------

def _edit(src, tmp_path, config_change=None, state_change=None):
    from quant_fixtures import _copy, _source
    config, state = _source(src)
    if config_change:
        config_change(config)
    if state_change:
        state_change(state)
    return _copy(src, tmp_path / "bad", config, state)


def test_refusals(quantised_dirs, tmp_path):
    fp8_dir, _ = quantised_dirs["fp8"]
    int4_dir, _ = quantised_dirs["int4"]
    name = "model.layers.0.self_attn.q_proj.weight"
    cases = [
        (fp8_dir, lambda c: c.pop("quantization_config"), None, "no quantization_config"),
        (fp8_dir, None, lambda s: s.pop(name + "_scale_inv"), "has no weight_scale_inv"),
        (fp8_dir, lambda c: c["quantization_config"].update(weight_block_size=[32]), None, "weight_block_size"),
        (fp8_dir, lambda c: c["quantization_config"].update(quant_method="awq"), None, "quant_method 'awq'"),
        (int4_dir, lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(symmetric=False),
         None, "asymmetric"),
        (int4_dir, lambda c: c["quantization_config"]["config_groups"]["group_0"].update(targets=["re:.*nothing"]),
         None, "no quantization_config.config_groups entry targets"),
        (int4_dir, lambda c: c["quantization_config"].update(format="marlin-24"), None, "format 'marlin-24'"),
        (int4_dir, None, lambda s: s.pop("model.layers.0.mlp.up_proj.weight_scale"), "missing"),
    ]
    for src, config_change, state_change, message in cases:
        bad = _edit(src, tmp_path, config_change, state_change)
        with pytest.raises(ValueError, match=message):
            load_target(bad, "float32")


def test_quantization_of_reads_kimi_style_config():
    raw = {"text_config": {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 32}},
                          "group_1": {"targets": ["re:.*shared_experts.*"],
                                      "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                  "strategy": "channel"}}},
        "ignore": ["lm_head", "re:.*self_attn.*"]}}}
    quant = quantization_of(raw)
    assert quant.scheme_for("language_model.model.layers.1.mlp.experts.7.down_proj").num_bits == 4
    shared = quant.scheme_for("language_model.model.layers.1.mlp.shared_experts.down_proj")
    assert (shared.num_bits, shared.group_size) == (8, None)          # a regex target beats a class name
