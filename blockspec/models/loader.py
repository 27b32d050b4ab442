"""Loading Hugging Face–format checkpoints: config.json plus safetensors (single or sharded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from blockspec.attention.backend import AttentionBackend
from blockspec.models.registry import load_config, model_class_for

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


def load_target(model_dir: str | Path, dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu", backend: AttentionBackend | None = None):
    """Build the target model (its class from the architecture registry) and load its weights."""
    cfg = load_config(model_dir)
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    with torch.device("meta"):
        model = model_class_for(cfg)(cfg, backend)
    state = load_state_dict(model_dir)
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
    model = model.to(device=torch_device, dtype=torch_dtype)
    model.rotary = type(model.rotary)(cfg.rope, cfg.head_dim).to(torch_device)
    return model.eval()
