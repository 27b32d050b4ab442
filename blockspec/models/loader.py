"""Loading Hugging Face–format checkpoints: config.json plus safetensors (single or sharded).

A wrapper checkpoint (registry `Wrapper`) loads its text model: weights under the wrapper's text
prefix are renamed to the text model's names and the vision weights are skipped (one log line).
Quantised weights are dequantised to the serving dtype (`models/quantized.py`; one log line
states the memory cost), except packed INT4 weights of a module that keeps them packed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from blockspec.attention.backend import AttentionBackend
from blockspec.layers.int4_experts import Int4GroupedExperts
from blockspec.layers.int4_linear import Int4Linear
from blockspec.layers.moe import MoE
from blockspec.models.quantized import Quantization, dequantize_state_dict, human_bytes, quantization_of
from blockspec.models.registry import Wrapper, model_class_for, parse_config, read_config, wrapper_of

logger = logging.getLogger("blockspec")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def parse_device(name: str | torch.device) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N' (CUDA must be available); 'auto' = cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    return device


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a checkpoint, following model.safetensors.index.json when sharded."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    return files


def load_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in safetensors_files(model_dir):
        state.update(load_file(str(f)))
    return state


def drop_skipped(state: dict[str, torch.Tensor], wrapper: Wrapper | None) -> None:
    """Remove (in place) a wrapper's weights that blockspec does not load, with one log line."""
    if wrapper is None:
        return
    skipped = [k for k in state if k.startswith(wrapper.skipped_prefixes)]
    if skipped:
        size = sum(state[k].numel() * state[k].element_size() for k in skipped)
        for k in skipped:
            del state[k]
        logger.info("%s: skipped %d vision weights (%s; %s): blockspec serves the text model only",
                    wrapper.name, len(skipped), ", ".join(p + "*" for p in wrapper.skipped_prefixes), human_bytes(size))


def text_names(state: dict[str, torch.Tensor], wrapper: Wrapper | None) -> dict[str, torch.Tensor]:
    """A wrapper's text weights under the text model's own names (others are left as they are,
    so the unexpected-weights check names them)."""
    if wrapper is None:
        return state
    prefix = wrapper.text_prefix
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def keep_int4_linears(model: nn.Module, state: dict[str, torch.Tensor], quant: Quantization | None,
                      prefix: str = "") -> None:
    """Swap every `nn.Linear` of `model` whose checkpoint weight is packed (`prefix + name +
    ".weight_packed"` in `state`) for an `Int4Linear` on meta, so the weight loads packed."""
    for name, module in list(model.named_modules()):
        key = prefix + name + "."
        scheme = quant.scheme_for(prefix + name) if quant is not None else None
        if isinstance(module, nn.Linear) and key + "weight_packed" in state and scheme is not None:
            k = module.in_features
            layer = Int4Linear(k, module.out_features, module.bias is not None, group_size=scheme.group_size or k,
                               num_bits=scheme.num_bits, device="meta", dtype=state[key + "weight_scale"].dtype)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)


def keep_int4_experts(model: nn.Module, state: dict[str, torch.Tensor], quant: Quantization | None,
                      prefix: str = "") -> set[str]:
    """Swap every MoE layer's routed experts whose checkpoint weights are packed (`prefix + name +
    ".0.gate_proj.weight_packed"` in `state`) for an `Int4GroupedExperts` on meta, so that they
    load packed. Returns the per-expert module names (with `prefix`) whose packed tensors it takes."""
    kept: set[str] = set()
    for name, moe in list(model.named_modules()):
        if not isinstance(moe, MoE) or quant is None:
            continue
        experts = prefix + (name + "." if name else "") + "experts."
        if experts + "0.gate_proj.weight_packed" not in state:
            continue
        schemes = {quant.scheme_for(experts + "0." + p) for p in ("gate_proj", "up_proj", "down_proj")}
        if None in schemes or len(schemes) != 1:
            continue   # dequantize_state_dict names the module no config group targets
        scheme = schemes.pop()
        hidden = moe.gate.weight.shape[1]
        moe.experts = Int4GroupedExperts(hidden, moe.gate.cfg, scheme.group_size, scheme.num_bits, device="meta",
                                         dtype=state[experts + "0.gate_proj.weight_scale"].dtype)
        kept |= {k[:-len(".weight_packed")] for k in state if k.startswith(experts) and k.endswith(".weight_packed")}
    return kept


def model_weights(model_dir: str | Path, raw: dict, model: nn.Module, dtype: torch.dtype,
                  int4_linears: bool = False, int4_experts: bool = False) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under `model`'s names: a wrapper's vision weights dropped, its
    text weights renamed, quantised weights dequantised to `dtype` (or left packed for modules
    that keep them; `int4_linears` first makes every packed plain linear such a module,
    `int4_experts` every MoE layer's packed routed experts)."""
    wrapper, quant = wrapper_of(raw), quantization_of(raw)
    state = load_state_dict(model_dir)
    drop_skipped(state, wrapper)
    prefix = wrapper.text_prefix if wrapper else ""
    if int4_linears:
        keep_int4_linears(model, state, quant, prefix)
    keep = keep_int4_experts(model, state, quant, prefix) if int4_experts else set()
    log_int4_experts(state, int4_experts, len(keep), dtype)
    keep |= {prefix + k[:-len(".weight_packed")] for k in model.state_dict() if k.endswith(".weight_packed")}
    report = dequantize_state_dict(state, quant, dtype, keep)
    if quant is not None:
        logger.info("%s", report.line(dtype))
    return text_names(state, wrapper)


def log_int4_experts(state: dict[str, torch.Tensor], kept: bool, tensors: int, dtype: torch.dtype) -> None:
    """One line saying what became of packed routed-expert weights, when the checkpoint has some."""
    if not any(".experts." in k and k.endswith(".weight_packed") for k in state):
        return
    if kept:
        logger.info("routed experts: INT4 kept packed in memory (%d tensors; W4A16 grouped kernel on CUDA)", tensors)
    else:
        logger.info("routed experts: INT4 dequantised to %s (the default off CUDA; load_target(int4_experts=True) "
                    "keeps them packed)", str(dtype).removeprefix("torch."))


def load_target(model_dir: str | Path, dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu", backend: AttentionBackend | None = None,
                *, int4_linears: bool = False, int4_experts: bool | None = None):
    """Build the target model (its class from the architecture registry) and load its weights.

    `int4_linears=True` keeps packed INT4 weights of plain linear layers packed (`Int4Linear`:
    the W4A16 kernel on CUDA) instead of dequantising them. `int4_experts` does the same for
    MoE layers' routed experts (`Int4GroupedExperts`); None (the default) means packed on CUDA,
    dequantised elsewhere (the CPU has no kernel for them: packed there is only slower)."""
    raw = read_config(model_dir)
    cfg = parse_config(raw)
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    if int4_experts is None:
        int4_experts = torch_device.type == "cuda"
    with torch.device("meta"):
        model = model_class_for(cfg)(cfg, backend)
    state = model.convert_checkpoint(model_weights(model_dir, raw, model, torch_dtype, int4_linears, int4_experts))
    return assign_weights(model, cfg, state, model_dir, torch_device, torch_dtype)


def assign_weights(model: nn.Module, cfg, state: dict[str, torch.Tensor], model_dir, device: torch.device,
                   dtype: torch.dtype) -> nn.Module:
    """Load `state` (the model's names) into a model built on meta: every weight present and no
    other (errors name the first few), ties restored, moved to `device`/`dtype` (float32 where
    the model keeps it). Shared by the single-process and the tensor-parallel loaders."""
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = set(model.state_dict().keys())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = expected - set(state)
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks weights: {sorted(missing)[:5]}")
    unexpected = {k for k in set(state) - expected if not k.endswith("rotary_emb.inv_freq")}
    if unexpected:
        raise ValueError(f"checkpoint {model_dir} has unexpected weights: {sorted(unexpected)[:5]}")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Non-persistent buffers were created on meta; RoPE frequencies stay float32 in any dtype.
    model.rotary = type(model.rotary)(cfg.rope, cfg.head_dim)
    model = model.to(device=device, dtype=dtype)
    model.rotary = type(model.rotary)(cfg.rope, cfg.head_dim).to(device)
    keep_float32(model, state, device)
    return model.eval()


def keep_float32(model, state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put back, in float32 from the checkpoint, the weights the model keeps in float32
    (`model.float32_weights`: MoE routers choose experts on these values)."""
    suffixes = getattr(model, "float32_weights", ())
    if not suffixes:
        return
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith(suffixes) and name in state:
            tensor.data = state[name].to(device=device, dtype=torch.float32)
