"""Opt-in switch from the eager layers to the fused Triton kernels of `triton_ops`.

The default path never changes: a model runs the eager code until `enable_fused_ops(model)`
sets `fused = True` on its `RMSNorm`, `SwiGLU` and `ApplyRope` submodules. The kernels are
meant to give bit-identical outputs (see `triton_ops`), so greedy outputs do not move.
"""

from __future__ import annotations

import os
import warnings

from torch import nn

from blockspec.layers.mlp import SwiGLU
from blockspec.layers.norm import RMSNorm
from blockspec.layers.rope import ApplyRope

FUSABLE = {"rms_norm": RMSNorm, "silu_mul": SwiGLU, "rope": ApplyRope}


def _model_device(model: nn.Module):
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return None


def _model_device_type(model: nn.Module) -> str | None:
    device = _model_device(model)
    return None if device is None else device.type


def enable_fused_ops(model: nn.Module, ops: tuple[str, ...] | list[str] = tuple(FUSABLE), *,
                     allow_interpreter: bool = False, enabled: bool = True) -> int:
    """Set `fused = enabled` on every submodule of the kinds named in `ops` ("rms_norm" →
    `RMSNorm` (also its `forward_with_residual`), "silu_mul" → `SwiGLU`, "rope" → `ApplyRope`);
    returns how many were set.

    Enabling needs triton and a model on CUDA; a CPU model is accepted only with
    `allow_interpreter=True` (tests), where `blockspec.layers.triton_ops` must have been
    imported under `TRITON_INTERPRET=1`. Anything else is a ValueError, before any flag moves.
    """
    unknown = set(ops) - set(FUSABLE)
    if unknown:
        raise ValueError(f"unknown fused ops {sorted(unknown)}; known: {sorted(FUSABLE)}")
    if enabled:
        device = _model_device_type(model)
        if device != "cuda" and not (device == "cpu" and allow_interpreter):
            raise ValueError(f"fused Triton ops need a model on CUDA (this one is on {device}); "
                             "pass allow_interpreter=True to run them under Triton's interpreter")
        try:
            from blockspec.layers import triton_ops
        except ImportError as e:
            raise ValueError(f"fused ops need triton: {e}") from None
        if device == "cpu" and not triton_ops.INTERPRETED:
            raise ValueError("a CPU model needs Triton's interpreter: set TRITON_INTERPRET=1 before "
                             f"blockspec.layers.triton_ops is imported (now {os.environ.get('TRITON_INTERPRET')!r})")
        if device == "cuda" and triton_ops.INTERPRETED:
            raise ValueError("blockspec.layers.triton_ops was imported under TRITON_INTERPRET=1, "
                             "whose kernels take CPU tensors only")
        if device == "cuda" and "rms_norm" in ops:
            # Find the running torch's reduction order now, outside any CUDA-graph capture.
            if triton_ops.cuda_order_variant(_model_device(model)) is None:
                warnings.warn("this torch's CUDA reduction order is not modelled by "
                              "blockspec.layers.triton_ops: RMSNorm stays eager (still exact)")
    kinds = tuple(FUSABLE[op] for op in ops)
    count = 0
    for module in model.modules():
        if isinstance(module, kinds):
            module.fused = enabled
            count += 1
    return count


def disable_fused_ops(model: nn.Module) -> int:
    """Back to the eager code on every fusable submodule."""
    return enable_fused_ops(model, enabled=False)
