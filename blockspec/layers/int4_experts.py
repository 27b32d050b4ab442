"""The routed experts with their weights kept packed INT4 in memory (W4A16).

`Int4GroupedExperts` is `layers/moe.py`'s `GroupedExperts` with each expert's matrices stored
as compressed-tensors packs them (`layers/packed_int.py`): `gate_up_packed [E, 2I, ⌈H·b/32⌉]`
int32 with `gate_up_scale [E, 2I, ⌈H/G⌉]` (gate rows, then up rows) and `down_packed
[E, H, ⌈I·b/32⌉]` with `down_scale [E, H, ⌈I/G⌉]`. The routing, SwiGLU and combine are
GroupedExperts' own (`moe.swiglu_experts`); only the two products differ. On CUDA each is one
launch of the W4A16 grouped GEMM (`layers/triton_w4a16.py`), with the expert offsets made on
the device (no host sync: graph-capturable); elsewhere the reference: dequantise to the
activation dtype, then GroupedExperts' products — what a model loaded dequantised computes.
The packed buffers are stored N-major (`packed_int.n_major`), the layout the kernel reads at
the memory's rate; loading converts a checkpoint's K-major tensors.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from blockspec.config import MoEConfig
from blockspec.layers.moe import expert_product, grouped_mm_works, swiglu_experts
from blockspec.layers.packed_int import dequantize_packed, load_n_major, n_major, pack_int32, quantize_symmetric


class Int4GroupedExperts(nn.Module):
    """Routed experts, weights packed: x `[T, H]`, ids/weights `[T, k]` → `[T, H]`.

    `group_size` None means one scale per output channel (a group of all K), as compressed-
    tensors' "channel" strategy stores it."""

    # None: the kernel on CUDA, the reference elsewhere; True forces the kernel (tests run it
    # under Triton's interpreter on CPU), False the reference.
    kernel: bool | None = None

    def __init__(self, hidden: int, cfg: MoEConfig, group_size: int | None = 32, num_bits: int = 4,
                 device=None, dtype=None):
        super().__init__()
        if num_bits not in (2, 4, 8):
            raise ValueError(f"num_bits must be 2, 4 or 8, got {num_bits!r}")
        if group_size is not None and group_size <= 0:
            raise ValueError(f"group_size must be positive or None (per channel), got {group_size!r}")
        e, i = cfg.num_experts, cfg.intermediate_size
        self.num_experts, self.hidden, self.intermediate = e, hidden, i
        self.num_bits = num_bits
        self.gate_up_group = group_size or hidden
        self.down_group = group_size or i
        for name, n, k, group in (("gate_up", 2 * i, hidden, self.gate_up_group), ("down", hidden, i, self.down_group)):
            words = math.ceil(k * num_bits / 32)
            self.register_buffer(f"{name}_packed", n_major(torch.zeros(e, n, words, dtype=torch.int32, device=device)))
            self.register_buffer(f"{name}_scale", n_major(torch.ones(e, n, math.ceil(k / group), dtype=dtype,
                                                                     device=device)))
        load_n_major(self, "gate_up_packed", "gate_up_scale", "down_packed", "down_scale")

    @classmethod
    def from_experts(cls, experts: nn.Module, cfg: MoEConfig, group_size: int | None = 32,
                     num_bits: int = 4) -> "Int4GroupedExperts":
        """A `GroupedExperts`' weights quantised round-to-nearest, symmetric, in groups along K —
        one expert at a time (the float32 copy of all 384 of Kimi's is 42 GB)."""
        w = experts.gate_up_proj.detach()
        layer = cls(w.shape[2], cfg, group_size, num_bits, device=w.device, dtype=w.dtype)
        for name, weight, group in (("gate_up", w, layer.gate_up_group),
                                    ("down", experts.down_proj.detach(), layer.down_group)):
            for e in range(weight.shape[0]):
                values, scale = quantize_symmetric(weight[e], group, num_bits)
                getattr(layer, f"{name}_packed")[e].copy_(pack_int32(values, num_bits))
                getattr(layer, f"{name}_scale")[e].copy_(scale)
        return layer

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up `[E, 2I, H]`, down `[E, H, I]`) in float32."""
        return (dequantize_packed(self.gate_up_packed, self.gate_up_scale, self.hidden, self.gate_up_group,
                                  self.num_bits),
                dequantize_packed(self.down_packed, self.down_scale, self.intermediate, self.down_group,
                                  self.num_bits))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x `[T, H]`, ids/weights `[T, k]` → Σ_k weights · expert_k(x) `[T, H]` (x's dtype)."""
        use_kernel = x.is_cuda if self.kernel is None else self.kernel
        if not use_kernel:
            gate_up, down = (w.to(x.dtype) for w in self.dequantized())
            grouped = grouped_mm_works(x.device, x.dtype, self.hidden, self.intermediate)
            return swiglu_experts(x, ids, weights, self.num_experts,
                                  lambda rows, e, ends: expert_product(rows, gate_up, e, ends, grouped),
                                  lambda rows, e, ends: expert_product(rows, down, e, ends, grouped))
        from blockspec.layers.triton_w4a16 import grouped_matmul

        def product(name: str, group: int):
            def run(rows: torch.Tensor, sorted_ids: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
                offsets = torch.cat([ends.new_zeros(1), ends])        # [E+1], on the device
                return grouped_matmul(rows, getattr(self, f"{name}_packed"), getattr(self, f"{name}_scale"),
                                      offsets, group, self.num_bits)
            return run
        return swiglu_experts(x, ids, weights, self.num_experts, product("gate_up", self.gate_up_group),
                              product("down", self.down_group))

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"bits={self.num_bits}, group={self.gate_up_group}/{self.down_group}")
