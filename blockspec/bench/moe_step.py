"""`blockspec bench step --shape kimi-k2-slice`: Kimi K2's dimensions with two layers (one dense,
one MoE with all its routed experts) and the full vocabulary, random weights.

Two kinds of figure, each beside its bandwidth floor (bytes ÷ the copy bandwidth measured in
the same run, as `bench/step.py`):
- the decode step (the engine's own `SpeculativeStep.run`, graphed on CUDA) at each batch, its
  floor the bytes that step actually touches: every weight but the routed experts and the
  embedding table (attention, dense MLP, shared expert, router, head), the routed experts the
  step's tokens chose (counted from the router's choices in that very step: rows get distinct
  tokens so that they route apart), and the latent cache's rows;
- MLA attention alone (one layer's `mla_forward` through the engine's backend: latent write,
  absorbed decode) at each batch and each context of `attention_contexts`, its floor the
  latent rows it reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import torch

from blockspec.attention.backend import select_backend
from blockspec.attention.metadata import AttentionBatch
from blockspec.bench.step import StepFigure, StepHarness, _sync, copy_bandwidth, random_target, weight_bytes
from blockspec.kv.cache import LatentCacheSpec
from blockspec.layers.moe import MoE


def kimi_k2_slice(hidden=7168, intermediate=18432, moe_intermediate=2048, heads=64, q_lora=1536, kv_lora=512,
                  nope=128, rope=64, v_dim=128, experts=384, top_k=8, vocab=163840) -> dict:
    """config.json of Kimi K2 (K2.5/K2.6's text model) cut to 2 layers: layer 0 dense, layer 1 MoE."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": hidden,
            "intermediate_size": intermediate, "moe_intermediate_size": moe_intermediate, "num_hidden_layers": 2,
            "num_attention_heads": heads, "num_key_value_heads": heads, "q_lora_rank": q_lora,
            "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v_dim,
            "n_routed_experts": experts, "num_experts_per_tok": top_k, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "vocab_size": vocab, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
            "tie_word_embeddings": False}


MOE_SHAPES = {
    "kimi-k2-slice": kimi_k2_slice(),
    # The same code at test scale (CPU).
    "kimi-k2-slice-tiny": kimi_k2_slice(64, 96, 32, 4, 48, 32, 16, 8, 16, 16, 4, 512),
}


def _moe_layers(model) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def step_bytes(model, experts_hit: int, kv_bytes: int) -> dict[str, int]:
    """Bytes one decode step reads: every weight except the routed experts and the embedding
    table, the `experts_hit` routed experts (per MoE layer, summed by the caller's count), the cache."""
    moe = _moe_layers(model)
    routed = sum(weight_bytes(m.experts) for m in moe)
    per_expert = routed // max(1, sum(m.experts.num_experts for m in moe))
    dense = weight_bytes(model) - routed
    return {"weights_without_routed": dense, "routed_experts_hit": experts_hit * per_expert, "latent_cache": kv_bytes,
            "per_expert": per_expert}


def time_attention(model, backend, batch: int, context: int, iters: int, page_size: int = 64) -> float:
    """ms per `mla_forward` of one layer: a decode query per row over `context` cached rows."""
    cfg, device, dtype = model.config, model.lm_head.weight.device, model.lm_head.weight.dtype
    per_row = -(-(context + 1) // page_size)
    cache = LatentCacheSpec(1, cfg.kv_lora_rank, cfg.qk_rope_head_dim).allocate(batch * per_row + 1, page_size,
                                                                                 dtype, device)
    page_table = 1 + torch.arange(batch * per_row, device=device).view(batch, per_row)
    prefix = torch.full((batch,), context, device=device)
    slots = (page_table[:, context // page_size] * page_size + context % page_size)[:, None]
    attn_batch = AttentionBatch(slots, page_table, prefix, torch.ones(batch, dtype=torch.long, device=device),
                                None, "causal")
    plan = backend.plan(attn_batch, cache)
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, 1, cfg.num_heads, cache.latent.shape[-1], device=device, generator=gen).to(dtype)
    latent = torch.randn(batch, 1, cache.latent.shape[-1], device=device, generator=gen).to(dtype)
    scale = model.model.layers[0].self_attn.scale
    for _ in range(2):
        backend.mla_forward(q, latent, cache, 0, plan, scale)
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        backend.mla_forward(q, latent, cache, 0, plan, scale)
    _sync(device)
    return (time.perf_counter() - start) / iters * 1e3


def pack_experts(model, group_size: int = 32) -> None:
    """Every MoE layer's routed experts quantised to INT4 in groups of `group_size` along K and
    kept packed (`Int4GroupedExperts`: the W4A16 kernel on CUDA), as Kimi K2.5/K2.6 ship them."""
    from blockspec.layers.int4_experts import Int4GroupedExperts
    for moe in _moe_layers(model):
        moe.experts = Int4GroupedExperts.from_experts(moe.experts, moe.gate.cfg, group_size)
    if model.lm_head.weight.device.type == "cuda":
        torch.cuda.empty_cache()


def run_moe_slice_bench(cfg, log=print) -> dict:
    """The Kimi-slice figures for a `StepBenchConfig` (its shape, device, dtype, context,
    batches, iters, graphs, attention backend, attention_contexts, output)."""
    from blockspec.models.loader import parse_device, parse_dtype
    device, dtype = parse_device(cfg.device), parse_dtype(cfg.dtype)
    backend = select_backend(cfg.attention_backend, device)
    model = random_target(dict(MOE_SHAPES[cfg.shape]), dtype, device, backend)
    if cfg.int4_experts:
        pack_experts(model)
    bandwidth = copy_bandwidth(device)
    kv_per_token = model.cache_spec.bytes_per_token(dtype)
    log(f"shape {cfg.shape}: weights {weight_bytes(model) / 1e9:.2f} GB, latent cache {kv_per_token} bytes per token, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, backend {backend.name}, graphs {cfg.graphs and device.type == 'cuda'}, "
        f"routed experts {'INT4 packed' if cfg.int4_experts else dtype}")
    for moe in _moe_layers(model):
        moe.record_expert_hits()
    figures, floors, profiles = [], {}, {}
    gen = torch.Generator().manual_seed(0)
    for batch in cfg.batches:
        harness = StepHarness(model, batch, cfg.context, None, 0.0, cfg.graphs)
        for seq in harness.seqs:          # distinct roots, so that rows route to different experts
            seq.tokens[-1] = int(torch.randint(0, model.config.vocab_size, (1,), generator=gen))
        ms = harness.time_ms(cfg.iters)
        replay = harness.replay_ms(cfg.iters)
        overlapped = harness.overlapped_ms(cfg.iters)
        hit = sum(int(m.expert_hits.sum()) for m in _moe_layers(model))   # in the last step timed
        if cfg.profile and device.type == "cuda":
            kernels = harness.profile()       # the graphed step's kernels, by device time
            profiles[f"decode batch {batch}"] = {"replay_ms": replay, "top_kernels": kernels,
                                                 "kernel_us_sum": sum(k["us_per_step"] for k in kernels)}
        parts = step_bytes(model, hit, batch * cfg.context * kv_per_token)
        floor = (parts["weights_without_routed"] + parts["routed_experts_hit"] + parts["latent_cache"]) / bandwidth * 1e3
        figures.append(StepFigure("decode T=0", batch, 1, ms, floor, ms / floor, harness.capture_s, replay,
                                  None if replay is None else ms - replay, overlapped))
        floors[f"decode batch {batch}"] = {**parts, "experts_hit": hit}
        log(f"decode batch {batch:>3}: {ms:8.3f} ms  floor {floor:7.3f} ms  × {ms / floor:5.2f}  ({hit} experts hit)"
            + (f"  replay {replay:7.3f} ms (× {replay / floor:5.2f})" if replay else "")
            + (f"  overlapped {overlapped:7.3f} ms" if overlapped else ""))
        del harness
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for context in cfg.attention_contexts:
        for batch in cfg.batches:
            ms = time_attention(model, backend, batch, context, cfg.iters)
            rows = batch * (context + 1) * model.cache_spec.row_dim * torch.finfo(dtype).bits // 8
            floor = rows / bandwidth * 1e3
            figures.append(StepFigure(f"mla attention ctx {context}", batch, 1, ms, floor, ms / floor))
            log(f"mla attention ctx {context:>6} batch {batch:>3}: {ms:8.3f} ms  latent read {floor:7.3f} ms  "
                f"× {ms / floor:5.2f}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result = {"config": asdict(cfg), "copy_bandwidth_bytes_per_s": bandwidth, "weight_bytes": weight_bytes(model),
              "kv_bytes_per_token": kv_per_token, "step_bytes": floors, "profiles": profiles, "figures": [asdict(f) for f in figures]}
    if cfg.output:
        with open(cfg.output, "w") as f:
            json.dump(result, f, indent=2)
    return result
