"""A DeepSeek-V3 / Kimi-style checkpoint whose routed experts are pack-quantized INT4 loads with
the experts kept packed (`Int4GroupedExperts`) and computes what the dequantised load computes."""

from __future__ import annotations

import logging

import pytest
import torch

from blockspec.layers.int4_experts import Int4GroupedExperts
from blockspec.layers.moe import GroupedExperts
from blockspec.models.loader import load_target
from quant_fixtures import int4_copy
from test_models_moe import our_logits as logits_and_features

ROUTED = r".*mlp\.experts\.\d+\.(gate|up|down)_proj$"     # as Kimi K2.5 ships: routed experts only


def our_logits(model, ids):
    return logits_and_features(model, ids)[0]


@pytest.fixture(scope="module")
def int4_moe_dirs(tmp_path_factory):
    """(INT4-experts DeepSeek-V3 dir, its dequantised reference)."""
    from moe_fixtures import write_deepseek_v3
    src = write_deepseek_v3(tmp_path_factory.mktemp("deepseek_v3"))
    return int4_copy(src, tmp_path_factory.mktemp("int4_moe"), pattern=ROUTED)


def test_experts_kept_packed_match_the_dequantised_load(int4_moe_dirs, caplog):
    quant_dir, ref_dir = int4_moe_dirs
    with caplog.at_level(logging.INFO, logger="blockspec"):
        packed = load_target(quant_dir, "float32", int4_experts=True)
    experts = [m for m in packed.modules() if isinstance(m, Int4GroupedExperts)]
    assert len(experts) == 1                                   # layer 0 dense, layer 1 MoE
    assert not any(type(m) is GroupedExperts for m in packed.modules())
    e = experts[0]
    assert e.gate_up_packed.dtype == e.down_packed.dtype == torch.int32   # memory really packed
    assert e.gate_up_packed.shape == (8, 64, 8) and e.down_packed.shape == (8, 64, 4)
    assert e.gate_up_scale.shape == (8, 64, 2) and e.down_scale.shape == (8, 64, 1)
    # Stored N-major, the layout the W4A16 kernel reads at the memory's rate.
    assert all(getattr(e, b).stride(1) == 1 for b in ("gate_up_packed", "gate_up_scale", "down_packed", "down_scale"))
    assert "routed experts: INT4 kept packed in memory (24 tensors" in caplog.text
    assert "24 kept packed" in caplog.text
    with caplog.at_level(logging.INFO, logger="blockspec"):
        dequantised = load_target(quant_dir, "float32")        # CPU: dequantised by default
    assert "routed experts: INT4 dequantised to float32" in caplog.text
    reference = load_target(ref_dir, "float32")
    ids = torch.randint(0, packed.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = our_logits(reference, ids)
        assert torch.equal(our_logits(dequantised, ids), ref)
        assert torch.equal(our_logits(packed, ids), ref)      # reference path: dequantise, same products
        e.kernel = True                                       # the W4A16 kernel (interpreted on CPU)
        kernel = our_logits(packed, ids)
    assert (kernel - ref).abs().max() / ref.abs().max() < 1e-5


def test_a_missing_packed_expert_is_named(int4_moe_dirs, tmp_path):
    from quant_fixtures import _copy, _source
    quant_dir, _ = int4_moe_dirs
    config, state = _source(quant_dir)
    for suffix in ("weight_packed", "weight_scale", "weight_shape"):
        del state[f"model.layers.1.mlp.experts.5.up_proj.{suffix}"]
    bad = _copy(quant_dir, tmp_path / "bad", config, state)
    with pytest.raises(ValueError, match=r"lacks model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight_packed"):
        load_target(bad, "float32", int4_experts=True)
