"""Tiny quantised checkpoints made from a dense fixture, and the dequantised reference of each.

`fp8_copy` writes DeepSeek's FP8 block format, `int4_copy` compressed-tensors' pack-quantized
INT4 (packed by the compressed-tensors package itself), `kimi_k25_copy` wraps a checkpoint as
Kimi K2.5's `kimi_k25` (weights under `language_model.`, plus vision weights). Each also writes
the reference: the same model with the dequantised weights stored as float32, no quantisation.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = 448.0   # largest finite float8_e4m3fn
PROJECTION = re.compile(r".*_proj\.weight$")


def _copy(src: Path, out: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """`src`'s tokenizer and generation files with `config` and `state` as the checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    return out


def _source(src) -> tuple[dict, dict[str, torch.Tensor]]:
    src = Path(src)
    return json.loads((src / "config.json").read_text()), load_file(str(src / "model.safetensors"))


def fp8_block_quantize(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float8 weight, weight_scale_inv, the dequantised float32 weight), block by block in a loop
    (the reference does not share the loader's broadcasting)."""
    n, k = weight.shape
    bn, bk = block
    scale_inv = torch.empty(math.ceil(n / bn), math.ceil(k / bk))
    fp8 = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    ref = torch.empty(n, k)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            tile = weight[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
            s = tile.abs().max().clamp(min=1e-12) / FP8_MAX
            q = (tile / s).to(torch.float8_e4m3fn)
            scale_inv[i, j] = s
            fp8[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = q
            ref[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = q.float() * s
    return fp8, scale_inv, ref


def fp8_copy(src, out: Path, block=(32, 48)) -> tuple[Path, Path]:
    """Every projection weight in FP8 blocks (`block` leaves ragged edges on 64-wide weights)."""
    config, state = _source(src)
    quantised, reference = {}, {}
    for name, w in state.items():
        if PROJECTION.match(name):
            fp8, scale_inv, ref = fp8_block_quantize(w, block)
            quantised[name], quantised[name + "_scale_inv"] = fp8, scale_inv
            reference[name] = ref
        else:
            quantised[name] = reference[name] = w
    qconfig = {**config, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                                 "weight_block_size": list(block)}}
    return _copy(src, out / "fp8", qconfig, quantised), _copy(src, out / "fp8_ref", config, reference)


def int4_copy(src, out: Path, pattern: str = r".*mlp\..*_proj$", group_size: int = 32) -> tuple[Path, Path]:
    """Projections whose module matches `pattern` in pack-quantized INT4, packed by compressed-tensors."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    from blockspec.layers.packed_int import quantize_symmetric

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size))
    config, state = _source(src)
    quantised, reference = {}, {}
    for name, w in state.items():
        module = name[:-len(".weight")]
        if PROJECTION.match(name) and re.match(pattern, module):
            _, scale = quantize_symmetric(w, group_size)
            packed = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
            quantised.update({f"{module}.{k}": v for k, v in packed.items()})
            reference[name] = PackedQuantizationCompressor.decompress(packed, scheme)["weight"]
        else:
            quantised[name] = reference[name] = w
    qconfig = {**config, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                      "weights": scheme.weights.model_dump(exclude_none=True)}},
        "ignore": ["lm_head", "re:.*self_attn.*"]}}
    return _copy(src, out / "int4", qconfig, quantised), _copy(src, out / "int4_ref", config, reference)


def kimi_k25_copy(src, out: Path) -> Path:
    """`src` (a dense checkpoint, maybe quantised) wrapped as kimi_k25: its config as text_config
    (quantization_config moved to the top, as Kimi K2.5 ships it), its weights under
    `language_model.`, and a vision tower and projector that must not be loaded."""
    config, state = _source(src)
    quant = config.pop("quantization_config", None)
    eos = config.pop("eos_token_id")
    wrapped = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "eos_token_id": eos, "text_config": config,
               "vision_config": {"model_type": "moonvit", "hidden_size": 16}}
    if quant:
        wrapped["quantization_config"] = quant
    weights = {"language_model." + k: v for k, v in state.items()}
    gen = torch.Generator().manual_seed(0)
    weights["vision_tower.encoder.blocks.0.wqkv.weight"] = torch.randn(48, 16, generator=gen)
    weights["vision_tower.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 2, generator=gen)
    weights["mm_projector.proj.0.weight"] = torch.randn(config["hidden_size"], 16, generator=gen)
    return _copy(src, out, wrapped, weights)
