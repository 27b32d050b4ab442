"""A rank's shard of a checkpoint, read tensor by tensor as slices of the safetensors files:
no rank ever holds the whole checkpoint (nor one whole sharded matrix) in memory.

Names, the wrapper's text prefix and skipped vision weights, the MoE experts' stacking and the
float32 router follow `models/loader.py`; the slices are `sharding.checkpoint_slice`'s.
Quantised checkpoints are refused (their scales would need the same slicing: not done yet).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from blockspec.attention.backend import AttentionBackend
from blockspec.models.loader import assign_weights, parse_dtype, safetensors_files
from blockspec.models.quantized import quantization_of
from blockspec.models.registry import model_class_for, parse_config, read_config, wrapper_of
from blockspec.parallel.group import Group
from blockspec.parallel.sharding import ShardPlan, Slice, checkpoint_slice, shard_modules


def read_slice(handle, key: str, rule: Slice, rank: int) -> torch.Tensor:
    """Only the rows / columns `rule` names of tensor `key` (a `safe_open` handle)."""
    view = handle.get_slice(key)
    if rule.rank0_only:
        t = view[:]
        return t if rank == 0 else torch.zeros_like(t)
    if rule.units == 1:
        return view[:]
    n = view.get_shape()[rule.dim]
    if n % rule.units:
        raise ValueError(f"{key}: dimension {rule.dim} ({n}) does not split into {rule.units} equal parts")
    per = n // rule.units
    a, b = rule.u0 * per, rule.u1 * per
    t = view[a:b] if rule.dim == 0 else view[:, a:b]
    if rule.pad_rows is not None and t.shape[0] < rule.pad_rows:
        t = torch.cat([t, t.new_zeros(rule.pad_rows - t.shape[0], *t.shape[1:])])
    return t


def load_shard(model_dir: str | Path, dtype: str | torch.dtype, device: torch.device,
               backend: AttentionBackend | None, plan: ShardPlan, group: Group):
    """This rank's shard of the target in `model_dir`, on `device` (eval mode)."""
    raw = read_config(model_dir)
    if quantization_of(raw) is not None:
        raise ValueError("tensor_parallel_size > 1 needs an unquantised checkpoint: quantised weights "
                         "(quantization_config) are not sharded yet")
    cfg = parse_config(raw)
    torch_dtype = parse_dtype(dtype)
    with torch.device("meta"):
        model = model_class_for(cfg)(cfg, backend)
    shard_modules(model, plan, group)
    wrapper = wrapper_of(raw)
    prefix = wrapper.text_prefix if wrapper else ""
    skipped = wrapper.skipped_prefixes if wrapper else ()
    keep32 = getattr(model, "float32_weights", ())
    state: dict[str, torch.Tensor] = {}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if skipped and key.startswith(skipped):
                    continue
                name = key[len(prefix):] if prefix and key.startswith(prefix) else key
                found = checkpoint_slice(name, cfg, plan)
                if found is None:
                    continue
                new_name, rule = found
                t = read_slice(handle, key, rule, plan.rank)
                state[new_name] = t if new_name.endswith(keep32) else t.to(torch_dtype)
    return assign_weights(model, cfg, model.convert_checkpoint(state), model_dir, device, torch_dtype)
