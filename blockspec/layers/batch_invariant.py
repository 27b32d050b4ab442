"""The switch of a model's layers to the batch-invariant kernels (`--batch-invariant`).

`make_batch_invariant(model)` turns every `nn.Linear` (merged projections and the LM head
included) into an `InvariantLinear`, whose product is the fixed-tile GEMM of
`triton_matmul.py`, and sets `batch_invariant = True` on every `RMSNorm` (the fixed-order
kernel of `triton_invariant_norm.py`). Attention is the backend's job
(`attention/invariant_backend.py`); the engine picks both (docs/batch_invariance.md). The rest of
a dense decoder layer is pointwise (RoPE, SiLU·mul, residual adds, embeddings), whose results
never depend on the batch.

What the mode cannot honour is refused before any layer changes, with a ValueError that names
batch_invariant: mixtures of experts (the routed grouped products and the router), int4
weights (the W4A16 kernel's split of K), MLA targets (latent attention has no invariant
kernel), CPU models without Triton's interpreter, bfloat16 under the interpreter.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from blockspec.layers.norm import RMSNorm


class InvariantLinear(nn.Linear):
    """An `nn.Linear` whose product is `triton_matmul.linear` (set by `make_batch_invariant`,
    which changes the class of existing layers in place: weights and names stay)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from blockspec.layers import triton_matmul
        return triton_matmul.linear(x, self.weight, self.bias)


def _device(model: nn.Module) -> torch.device | None:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return None


def unsupported_parts(model: nn.Module) -> list[str]:
    """What in `model` has no batch-invariant kernel (empty: the mode can be honoured)."""
    from blockspec.kv.cache import LatentCacheSpec
    from blockspec.layers.int4_linear import Int4Linear
    from blockspec.layers.moe import MoE, Router
    found = []
    kinds = {MoE: "mixture-of-experts layers", Router: "MoE routers", Int4Linear: "int4 linear layers"}
    for kind, what in kinds.items():
        if any(isinstance(m, kind) for m in model.modules()):
            found.append(what)
    try:
        spec = model.cache_spec
    except (AttributeError, NotImplementedError):
        spec = None
    if isinstance(spec, LatentCacheSpec):
        found.append("MLA attention (latent cache)")
    return found


def check_batch_invariant_device(device: torch.device, dtype: torch.dtype, allow_interpreter: bool) -> None:
    """ValueError unless the invariant kernels can run here: CUDA, or (tests) the CPU under
    Triton's interpreter in float32/float16."""
    if device.type == "cuda":
        return
    if device.type != "cpu" or not allow_interpreter or os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"batch_invariant needs a CUDA device (got {device}); the CPU runs its kernels only "
                         "under Triton's interpreter (TRITON_INTERPRET=1, tests)")
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"batch_invariant under Triton's interpreter needs float32 or float16, got {dtype} "
                         "(bfloat16 loads are wrong under the interpreter)")


def make_batch_invariant(model: nn.Module, *, allow_interpreter: bool = False, enabled: bool = True) -> int:
    """Switch `model`'s linear layers and RMSNorms to the batch-invariant kernels (or back, with
    `enabled=False`); returns how many layers were switched. Refuses (ValueError naming
    batch_invariant) a model with parts the mode does not cover, or a device it cannot run on,
    before anything changes."""
    if enabled:
        parts = unsupported_parts(model)
        if parts:
            raise ValueError(f"batch_invariant does not cover {', '.join(parts)}: no invariant kernel for them")
        device = _device(model)
        if device is None:
            raise ValueError("batch_invariant: the model has no parameters to place")
        check_batch_invariant_device(device, next(model.parameters()).dtype, allow_interpreter)
        from blockspec.layers import triton_matmul  # noqa: F401 - triton present, interpreter state read
        if device.type == "cpu" and not triton_matmul.INTERPRETED:
            raise ValueError("batch_invariant on the CPU needs TRITON_INTERPRET=1 before "
                             "blockspec.layers.triton_matmul is imported")
        if device.type == "cuda" and triton_matmul.INTERPRETED:
            raise ValueError("batch_invariant: blockspec.layers.triton_matmul was imported under "
                             "TRITON_INTERPRET=1, whose kernels take CPU tensors only")
    count = 0
    for module in model.modules():
        if type(module) in (nn.Linear, InvariantLinear):
            module.__class__ = InvariantLinear if enabled else nn.Linear
            count += 1
        elif isinstance(module, RMSNorm):
            module.batch_invariant = enabled
            count += 1
    return count


def is_batch_invariant(model: nn.Module) -> bool:
    """True when every linear layer and RMSNorm of `model` runs the invariant kernels."""
    layers = [m for m in model.modules() if type(m) in (nn.Linear, InvariantLinear) or isinstance(m, RMSNorm)]
    return bool(layers) and all(type(m) is InvariantLinear or getattr(m, "batch_invariant", False) for m in layers)


__all__ = ["InvariantLinear", "make_batch_invariant", "is_batch_invariant", "unsupported_parts",
           "check_batch_invariant_device"]
