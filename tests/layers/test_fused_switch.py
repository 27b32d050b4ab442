"""The engine's switch to the fused kernels: on only when the model's logits stay identical,
otherwise eager with a log line (here under Triton's interpreter on CPU)."""

from __future__ import annotations

import logging

import torch

from blockspec.models.fast_path import use_fused_ops_if_exact
from blockspec.layers.norm import RMSNorm
from blockspec.models.loader import load_target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def fused_flags(model):
    return {m.fused for m in model.modules() if isinstance(m, RMSNorm)}


def test_exact_kernels_are_switched_on(qwen3_dir):
    # silu·mul is exact on CUDA only (the interpreter's exp differs by an ulp): left out on CPU.
    ops = None if DEVICE == "cuda" else ("rms_norm", "rope")
    model = load_target(qwen3_dir, "float32", DEVICE)
    assert use_fused_ops_if_exact(model, ops) == list(ops or ("rms_norm", "silu_mul", "rope"))
    assert fused_flags(model) == {True}


def test_kernels_that_change_logits_stay_off(qwen3_dir, monkeypatch, caplog):
    from blockspec.layers import triton_ops
    model = load_target(qwen3_dir, "float32", DEVICE)
    real = triton_ops.rms_norm
    monkeypatch.setattr(triton_ops, "rms_norm", lambda x, w, eps: real(x, w, eps) * 1.001)   # an inexact kernel
    with caplog.at_level(logging.WARNING, logger="blockspec.engine"):
        kept = use_fused_ops_if_exact(model, ("rms_norm", "rope"))
    assert kept == ["rope"]                                    # the exact one is kept, alone
    assert fused_flags(model) == {False}
    assert "left eager: rms_norm" in caplog.text


def test_drafter_kernels_switched_on_only_when_exact(qwen3_dir, tmp_path):
    """A DFlash drafter takes the same switch, judged on its own probe hidden states."""
    from dflash_fixtures import write_dflash_drafter
    from blockspec.config import ModelConfig
    from blockspec.models.dflash import load_drafter
    from blockspec.models.fast_path import probe_drafter
    draft_dir = write_dflash_drafter(tmp_path / "d", qwen3_dir, num_layers=2)
    drafter = load_drafter(draft_dir, ModelConfig.load(qwen3_dir), torch.float32, torch.device(DEVICE))
    eager = probe_drafter(drafter)
    ops = None if DEVICE == "cuda" else ("rms_norm", "rope")
    assert use_fused_ops_if_exact(drafter, ops, probe=probe_drafter) == list(ops or ("rms_norm", "silu_mul", "rope"))
    assert fused_flags(drafter) == {True}
    assert torch.equal(probe_drafter(drafter), eager)
