"""Quantised checkpoints: their `quantization_config`, and their weights dequantised at load.

Two formats, detected per tensor by the names the checkpoint uses:

* DeepSeek FP8 block scales (`quant_method: "fp8"`, DeepSeek-V3, Kimi K2 Instruct): `X.weight`
  is float8_e4m3fn `[N, K]` and `X.weight_scale_inv` float32 `[ceil(N/bn), ceil(K/bk)]` for the
  block `weight_block_size = [bn, bk]`; the weight is `fp8 · scale` with each scale broadcast
  over its block (the last blocks of a ragged matrix are cut short).
* compressed-tensors "pack-quantized" (`quant_method: "compressed-tensors"`, Kimi K2.5/K2.6's
  routed experts): `X.weight_packed` int32 `[N, ceil(K·b/32)]`, `X.weight_scale` `[N, ceil(K/G)]`,
  `X.weight_shape` `[N, K]`. Value k of a row sits in word k // (32/b) at bit b·(k mod 32/b),
  least significant first, stored with an offset of 2^(b-1) (8 for int4) so the nibble is
  unsigned; symmetric, so the weight is `(nibble - 8) · scale` over groups of G along K.

Everything else in such a checkpoint (norms, embeddings, the router) is stored unquantised and
loads as it is. A model that keeps INT4 weights packed (a module with `weight_packed` and
`weight_scale` buffers, e.g. `layers.int4_linear.Int4Linear`, or routed experts swapped for
`layers.int4_experts.Int4GroupedExperts`: the loader names those modules in `keep_packed`)
receives them as they are.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field

import torch

from blockspec.layers.packed_int import dequantize_packed

logger = logging.getLogger("blockspec")

FP8_SCALE = "weight_scale_inv"
PACKED = ("weight_packed", "weight_scale", "weight_shape")


# ---- the math ----------------------------------------------------------------------------------

def expand_blocks(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """A per-block scale `[ceil(N/bn), ceil(K/bk)]` as a per-element one `[N, K]`."""
    (bn, bk), (n, k) = block, shape
    return scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float8 `[N, K]` × its block scales → float32 `[N, K]`."""
    n, k = weight.shape
    blocks = (math.ceil(n / block[0]), math.ceil(k / block[1]))
    if tuple(scale_inv.shape) != blocks:
        raise ValueError(f"weight_scale_inv has shape {tuple(scale_inv.shape)}; a {n}×{k} weight in "
                         f"{block[0]}×{block[1]} blocks needs {blocks}")
    return weight.float() * expand_blocks(scale_inv.float(), block, (n, k))


# ---- quantization_config ------------------------------------------------------------------------

@dataclass(frozen=True)
class IntScheme:
    """One compressed-tensors config group's weight scheme and the modules it targets."""
    num_bits: int
    group_size: int | None        # None: one scale per output channel
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Quantization:
    method: str                                   # "fp8" | "compressed-tensors"
    block: tuple[int, int] | None = None          # fp8: weight_block_size
    schemes: tuple[IntScheme, ...] = field(default=())

    def scheme_for(self, module: str) -> IntScheme | None:
        """The config group targeting `module`: an exact name first, then a `re:` pattern, then a
        class name (the packed tensors say the module is a quantised linear)."""
        for match in (lambda t: t == module,
                      lambda t: t.startswith("re:") and re.match(t[3:], module) is not None,
                      lambda t: not t.startswith("re:") and "." not in t and t[:1].isupper()):
            found = [s for s in self.schemes if any(match(t) for t in s.targets)]
            if found:
                return found[0]
        return None


def quantization_of(raw: dict) -> Quantization | None:
    """The checkpoint's `quantization_config` (top level, or a wrapper's `text_config`), checked."""
    qc = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError(f"quantization_config.weight_block_size must be two positive integers, got {block!r}")
        if qc.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"quantization_config.fmt {qc.get('fmt')!r} is not supported (e4m3)")
        return Quantization("fp8", block=(block[0], block[1]))
    if method == "compressed-tensors":
        return Quantization("compressed-tensors", schemes=tuple(
            _int_scheme(name, group, qc.get("format")) for name, group in (qc.get("config_groups") or {}).items()))
    raise ValueError(f"quantization_config.quant_method {method!r} is not supported (fp8, compressed-tensors)")


def _int_scheme(name: str, group: dict, default_format: str | None) -> IntScheme:
    where = f"quantization_config.config_groups.{name}"
    fmt = group.get("format") or default_format
    if fmt != "pack-quantized":
        raise ValueError(f"{where}: format {fmt!r} is not supported (pack-quantized)")
    if group.get("input_activations") or group.get("output_activations"):
        raise ValueError(f"{where}: activation quantization is not supported (weight-only schemes, W4A16)")
    w = group.get("weights") or {}
    if w.get("type") != "int" or w.get("num_bits") not in (2, 4, 8):
        raise ValueError(f"{where}.weights: type {w.get('type')!r} with num_bits {w.get('num_bits')!r} "
                         "is not supported (int, 2/4/8 bits)")
    if not w.get("symmetric", True):
        raise ValueError(f"{where}.weights.symmetric: asymmetric (zero-point) weights are not supported")
    strategy = w.get("strategy")
    if strategy not in ("group", "channel"):
        raise ValueError(f"{where}.weights.strategy {strategy!r} is not supported (group, channel)")
    if w.get("actorder") not in (None, "static", "weight"):   # "group" order reorders columns
        raise ValueError(f"{where}.weights.actorder {w.get('actorder')!r} is not supported")
    return IntScheme(int(w["num_bits"]), int(w["group_size"]) if strategy == "group" else None,
                     tuple(group.get("targets") or ()))


# ---- state dicts ---------------------------------------------------------------------------------

@dataclass
class DequantReport:
    """What dequantisation did, for the startup log line."""
    fmt: str = ""
    tensors: int = 0
    stored_bytes: int = 0       # the quantised tensors (values + scales) as stored
    dequantized_bytes: int = 0  # the same weights in the serving dtype
    kept_tensors: int = 0       # INT4 weights handed packed to a module that keeps them
    kept_bytes: int = 0

    def line(self, dtype: torch.dtype) -> str:
        text = (f"quantised weights ({self.fmt}): {self.tensors} dequantised to {str(dtype).removeprefix('torch.')}, "
                f"{human_bytes(self.stored_bytes)} as stored -> {human_bytes(self.dequantized_bytes)} in memory "
                f"(+{human_bytes(self.dequantized_bytes - self.stored_bytes)})")
        if self.kept_tensors:
            text += f"; {self.kept_tensors} kept packed ({human_bytes(self.kept_bytes)})"
        return text


def human_bytes(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def dequantize_state_dict(state: dict[str, torch.Tensor], quant: Quantization | None, dtype: torch.dtype,
                          keep_packed: set[str] = frozenset()) -> DequantReport:
    """Replace every quantised weight of `state` (in place) by its `dtype` form; packed weights
    whose module prefix is in `keep_packed` stay packed. Raises ValueError on a quantised tensor
    the config does not explain (or the reverse)."""
    report = DequantReport()
    fp8_weights = {k for k, v in state.items() if v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)}
    packed = [k[:-len("weight_packed")] for k in state if k.endswith(".weight_packed")]
    if quant is None:
        if fp8_weights or packed:
            raise ValueError(f"weight {sorted(fp8_weights) or packed[0]!r} is quantised but config.json has "
                             "no quantization_config")
        return report
    if quant.method == "fp8":
        if packed:
            raise ValueError(f"{packed[0]}weight_packed: packed weights in an fp8 checkpoint")
        report.fmt = f"fp8 e4m3, {quant.block[0]}x{quant.block[1]} blocks"
        for key in sorted(k for k in state if k.endswith("." + FP8_SCALE)):
            name = key[:-len(FP8_SCALE)] + "weight"
            if name not in fp8_weights:
                raise ValueError(f"{key} scales {name!r}, which is not a float8 weight of the checkpoint")
            weight, scale = state.pop(name), state.pop(key)
            fp8_weights.discard(name)
            state[name] = dequantize_fp8_block(weight, scale, quant.block).to(dtype)
            report.tensors += 1
            report.stored_bytes += _nbytes(weight, scale)
            report.dequantized_bytes += _nbytes(state[name])
        if fp8_weights:
            raise ValueError(f"float8 weight {sorted(fp8_weights)[0]!r} has no weight_scale_inv")
        return report
    if fp8_weights:
        raise ValueError(f"float8 weight {sorted(fp8_weights)[0]!r} in a compressed-tensors checkpoint")
    bits = sorted({s.num_bits for s in quant.schemes})
    report.fmt = f"pack-quantized int{'/'.join(map(str, bits))}"
    for prefix in sorted(packed):
        module = prefix[:-1]
        scheme = quant.scheme_for(module)
        missing = [prefix + p for p in PACKED if prefix + p not in state]
        if scheme is None or missing:
            raise ValueError(f"{prefix}weight_packed: " + (f"missing {missing}" if missing else
                             "no quantization_config.config_groups entry targets this module"))
        if prefix + "weight_zero_point" in state:
            raise ValueError(f"{prefix}weight_zero_point: asymmetric weights are not supported")
        n, k = (int(v) for v in state[prefix + "weight_shape"].tolist())
        scale = state[prefix + "weight_scale"]
        groups = 1 if scheme.group_size is None else math.ceil(k / scheme.group_size)
        if tuple(scale.shape) != (n, groups) or state[prefix + "weight_packed"].shape[-1] != math.ceil(k * scheme.num_bits / 32):
            raise ValueError(f"{prefix}weight_scale / weight_packed have shapes {tuple(scale.shape)} / "
                             f"{tuple(state[prefix + 'weight_packed'].shape)}, inconsistent with weight_shape "
                             f"{[n, k]} at {scheme.num_bits} bits, group {scheme.group_size}")
        if module in keep_packed:
            state.pop(prefix + "weight_shape")
            report.kept_tensors += 1
            report.kept_bytes += _nbytes(state[prefix + "weight_packed"], scale)
            continue
        tensors = [state.pop(prefix + p) for p in PACKED]
        state[prefix + "weight"] = dequantize_packed(tensors[0], tensors[1], k, scheme.group_size or k,
                                                  scheme.num_bits).to(dtype)
        report.tensors += 1
        report.stored_bytes += _nbytes(*tensors[:2])
        report.dequantized_bytes += _nbytes(state[prefix + "weight"])
    return report
